provider "google" {
  project = var.project_id
  region  = var.region

  # Labels every resource that supports them, so the whole deployment can be found (and billed)
  # by one label.
  default_labels = var.labels
}
