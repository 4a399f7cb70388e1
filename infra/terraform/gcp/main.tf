# maintenance-bridge on Google Cloud, in one apply:
#
#   agents (VMs) ──publish──► topic maintenance-events ──push subscription──► Cloud Function (gen2)
#                                      │ dead letters: maintenance-events-dead (+ pull subscription to inspect)
#                                      └ operator-results (command results, for `mbridge approve`)
#   function ──publish──► topic maintenance-commands ──► maintenance-commands-<vm> (filter on target) ──► agent
#   function ──► Firestore (state, audit) │ unmanaged instance groups │ instances.performMaintenance
#
# pubsub.tf: topics and subscriptions; function.tf: the function and its source; firestore.tf:
# database, indexes, TTL; central.tf: the control plane's path (log sink, tick, two functions); iam.tf: service accounts and every role; telemetry.tf: what telemetry adds; vm_example.tf: VMs running the agent;
# mig_example.tf, mig_health_checks.tf: a managed instance group running the agent (opt-in).

data "google_project" "this" {
  project_id = var.project_id
}

locals {
  # Pub/Sub's own service agent: it moves messages to dead-letter topics and signs push tokens.
  # Named through google_project_service_identity.pubsub (iam.tf), so that no grant to it is made
  # before it exists; its documented address stands in should the API answer without an email.
  pubsub_service_agent = "serviceAccount:${coalesce(google_project_service_identity.pubsub.email, "service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com")}"

  # The function drains the example's group plus any given; MBRIDGE_INSTANCE_GROUPS takes zone/name.
  instance_groups = distinct(concat(["${var.zone}/${var.instance_group_name}"], var.extra_instance_groups))
  # performMaintenance looks VMs up zone by zone (events carry names, not zones).
  maintenance_zones = distinct(concat([for group in local.instance_groups : split("/", group)[0]], var.extra_maintenance_zones))

  apis = concat([
    "artifactregistry.googleapis.com", # images built from the function source
    "cloudbuild.googleapis.com",       # builds the function
    "cloudscheduler.googleapis.com",   # the central tick (central.tf)
    "cloudfunctions.googleapis.com",
    "cloudresourcemanager.googleapis.com", # data.google_project, project IAM
    "compute.googleapis.com",
    "firestore.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com", # the central log sink (central.tf)
    "pubsub.googleapis.com",
    "run.googleapis.com", # gen2 functions are Cloud Run services
    "secretmanager.googleapis.com",
    "storage.googleapis.com",
  ], local.telemetry_apis)

}

resource "google_project_service" "apis" {
  for_each = var.enable_apis ? toset(local.apis) : toset([])

  project = var.project_id
  service = each.value
  # Other workloads of the project may use the same APIs: never switch them off on destroy.
  disable_on_destroy = false
}
