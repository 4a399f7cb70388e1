provider "google" {
  project = var.project_id
  region  = var.region

  # Labels every resource that supports them, so the whole deployment can be found (and billed)
  # by one label.
  default_labels = var.labels
}

# The same project, region and labels, for the one resource only google-beta carries
# (google_project_service_identity, iam.tf).
provider "google-beta" {
  project = var.project_id
  region  = var.region

  default_labels = var.labels
}
