# One VM's command subscription on maintenance-commands (docs/transports.md, Pub/Sub part).
#
# The filter keeps other VMs' commands out, and the subscriber role is granted on this
# subscription only, to this VM's own service account: no VM can read another VM's commands.
# (The Pub/Sub emulator ignores filters; the agent drops foreign commands itself as well.)

resource "google_pubsub_subscription" "commands" {
  project = var.project_id
  name    = "maintenance-commands-${var.vm_name}"
  topic   = var.commands_topic_id

  filter = "attributes.target = \"${var.vm_name}\""

  # A drain before its approve: the function publishes both with ordering key = VM name.
  enable_message_ordering = true

  ack_deadline_seconds       = var.ack_deadline_seconds
  message_retention_duration = var.message_retention_duration

  expiration_policy {
    ttl = "" # a VM may see no command for months; its subscription must still be there
  }

  dynamic "dead_letter_policy" {
    for_each = var.dead_letter_topic_id == null ? [] : [var.dead_letter_topic_id]
    content {
      dead_letter_topic     = dead_letter_policy.value
      max_delivery_attempts = var.max_delivery_attempts
    }
  }

  lifecycle {
    precondition {
      condition     = var.dead_letter_topic_id == null || var.pubsub_service_agent_email != null
      error_message = "dead_letter_topic_id needs pubsub_service_agent_email: the service agent must be allowed to take dead letters off this subscription."
    }
  }
}

resource "google_pubsub_subscription_iam_member" "agent" {
  project      = var.project_id
  subscription = google_pubsub_subscription.commands.name
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${var.agent_service_account_email}"
}

resource "google_pubsub_subscription_iam_member" "dead_letter" {
  count = var.dead_letter_topic_id == null ? 0 : 1

  project      = var.project_id
  subscription = google_pubsub_subscription.commands.name
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${var.pubsub_service_agent_email}"
}
