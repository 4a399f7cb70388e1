# State and audit of the function in Firestore, Native mode (docs/gcp.md, "State and audit").

resource "google_firestore_database" "main" {
  name        = var.firestore_database_name
  location_id = var.firestore_location
  type        = "FIRESTORE_NATIVE"
  # Claims, budget pools and drains are read-modify-write transactions: pessimistic concurrency
  # (the Native mode default) serialises two events racing for a pool's last slot.
  concurrency_mode            = "PESSIMISTIC"
  app_engine_integration_mode = "DISABLED"
  # Seven days of point-in-time reads: the audit trail and drain records can be recovered after
  # a bad write or a mistaken delete.
  point_in_time_recovery_enablement = "POINT_IN_TIME_RECOVERY_ENABLED"
  delete_protection_state           = "DELETE_PROTECTION_ENABLED"
  # `terraform destroy` leaves the database (and its audit trail) in place.
  deletion_policy = "ABANDON"

  depends_on = [google_project_service.apis]
}

# The audit log is queried by VM and by event id (case-insensitively, on event_id_lower), both
# ordered by recorded_at (functions/gcp_app/firestore_audit.py). A query by VM and event is served
# by merging the two.

resource "google_firestore_index" "audit_by_vm" {
  project     = var.project_id
  database    = google_firestore_database.main.name
  collection  = "${var.firestore_collection_prefix}audit"
  query_scope = "COLLECTION"

  fields {
    field_path = "vm"
    order      = "ASCENDING"
  }

  fields {
    field_path = "recorded_at"
    order      = "ASCENDING"
  }
}

resource "google_firestore_index" "audit_by_event" {
  project     = var.project_id
  database    = google_firestore_database.main.name
  collection  = "${var.firestore_collection_prefix}audit"
  query_scope = "COLLECTION"

  fields {
    field_path = "event_id_lower"
    order      = "ASCENDING"
  }

  fields {
    field_path = "recorded_at"
    order      = "ASCENDING"
  }
}

# Done claims carry expire_at (30 days on); the TTL policy deletes them then. Claims are read by
# document id only, so the field's single-field indexes are switched off (empty index_config),
# which also spares the write hotspot of a monotonically increasing indexed timestamp.
resource "google_firestore_field" "claims_ttl" {
  project    = var.project_id
  database   = google_firestore_database.main.name
  collection = "${var.firestore_collection_prefix}claims"
  field      = "expire_at"

  ttl_config {}

  index_config {}
}
