# Topics and subscriptions (docs/transports.md, Pub/Sub part; docs/gcp.md, delivery).

# ---------------------------------------------------------------- topics
#
# Encryption: Google-managed keys, or the customer-managed key var.kms_key_name (CMEK) when set.

resource "google_pubsub_topic" "events" {
  name         = "maintenance-events"
  kms_key_name = var.kms_key_name
  # A week of published events stays on the topic, so a subscription can be seeked back to
  # replay them (e.g. after a misconfiguration acknowledged events without acting).
  message_retention_duration = "604800s"

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.pubsub_cmek]
}

# One commands topic per shard, all alike (commands_shards.tf).
resource "google_pubsub_topic" "commands" {
  count        = var.commands_shards
  name         = local.commands_topic_names[count.index]
  kms_key_name = var.kms_key_name
  # No topic retention: commands expire 10 minutes after they are issued; each VM's
  # subscription keeps undelivered ones that long (modules/vm_commands_subscription).

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.pubsub_cmek]

  # Pub/Sub's quotas against the fleet (commands_shards.tf).
  lifecycle {
    precondition {
      condition     = alltrue([for check in values(local.commands_quota_checks) : check.ok])
      error_message = join(" ", [for check in values(local.commands_quota_checks) : check.message if !check.ok])
    }
  }
}

# The single commands topic of deployments before commands_shards is shard 0.
moved {
  from = google_pubsub_topic.commands
  to   = google_pubsub_topic.commands[0]
}

resource "google_pubsub_topic" "dead_letters" {
  name         = "maintenance-events-dead"
  kms_key_name = var.kms_key_name
  # Dead letters are evidence of events nobody acted on: keep them the longest Pub/Sub allows.
  message_retention_duration = "2678400s"

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.pubsub_cmek]
}

# ---------------------------------------------------------------- the function's delivery
#
# The function is fed by this push subscription rather than an Eventarc trigger: the
# subscription Eventarc creates is managed by Eventarc and cannot be given a dead-letter policy
# in Terraform. Pub/Sub POSTs the raw push body {"message": {...}, "subscription": "..."}; the
# functions framework turns it into the same google.cloud.pubsub.topic.v1.messagePublished
# CloudEvent Eventarc would deliver (functions_framework/event_conversion.py), so
# functions/gcp_app/entry.py serves both (tests/contract/gcp/test_push_subscription_entry.py).

resource "google_pubsub_subscription" "functions" {
  name  = "maintenance-events-functions"
  topic = google_pubsub_topic.events.id

  # For push, the ack deadline is how long Pub/Sub waits for the HTTP answer. The function may
  # run 540 s (a redelivery waits out another invocation's claim); 600 s is the most Pub/Sub allows.
  ack_deadline_seconds       = 600
  message_retention_duration = "604800s"

  # No message ordering, and the agents publish events without an ordering key
  # (wire/transports/pubsub/settings.py). Every agent may publish to the topic, and an ordering key
  # is whatever the publisher writes: with ordering on, junk keyed with another VM's name is pushed
  # one message at a time, each refused by the function, before that VM's genuine event (300 junk
  # messages: all handled first, tests/drills/test_ordering_flood.py; 2,000: 14 s instead of
  # 18 ms, docs/transports.md#why-events-carry-no-ordering-key). The function needs no order:
  # Service Bus and Eventarc give none, a dead-lettered message replayed comes out of order anyway,
  # and a step of an event that has ended is only audited as late (functions/core/lifecycle.py).
  # This also ends the head-of-line blocking of a VM's later events behind one that is retried.
  enable_message_ordering = false

  push_config {
    # The topic path after the URI lets the functions framework name the topic as the CloudEvent
    # source (it reads it from the request path); the function serves every path.
    push_endpoint = "${google_cloudfunctions2_function.events.service_config[0].uri}/${google_pubsub_topic.events.id}"

    oidc_token {
      service_account_email = google_service_account.push_invoker.email
      # Cloud Run checks the token's audience against the service URL, without the path.
      audience = google_cloudfunctions2_function.events.service_config[0].uri
    }
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letters.id
    max_delivery_attempts = var.max_delivery_attempts
  }

  expiration_policy {
    ttl = "" # never expires, however quiet the fleet is
  }

  depends_on = [
    # The first pushes must find the invoker allowed, and dead-lettering must work from the start.
    google_cloud_run_v2_service_iam_member.push_invoker,
    google_pubsub_topic_iam_member.dead_letter_publisher,
  ]
}

# Keeps dead letters readable (a topic without subscriptions drops what is published to it), for
# inspection and replay: publish a message's data and attributes to maintenance-events again once
# the cause is fixed; its envelope id makes the replay of something already done a no-op.
resource "google_pubsub_subscription" "dead_letters_inspect" {
  name                       = "maintenance-events-dead-inspect"
  topic                      = google_pubsub_topic.dead_letters.id
  ack_deadline_seconds       = 60
  message_retention_duration = "604800s"
  # Reading a dead letter acknowledges it; retained, it can still be replayed by seeking back.
  retain_acked_messages = true

  expiration_policy {
    ttl = ""
  }
}

# Command results (type org.maintenancebridge.command.accepted|rejected, set by the agent as
# attribute `type`) for `mbridge approve`; maintenance events stay out of it.
resource "google_pubsub_subscription" "operator_results" {
  name                       = "operator-results"
  topic                      = google_pubsub_topic.events.id
  filter                     = "hasPrefix(attributes.type, \"org.maintenancebridge.command.\")"
  ack_deadline_seconds       = 60
  message_retention_duration = "3600s"

  expiration_policy {
    ttl = ""
  }
}

# ---------------------------------------------------------------- one command subscription per VM
#
# On the commands topic of the VM's shard, for the example VMs and the members of the example
# managed instance group alike (local.commands_vm_names, commands_shards.tf).

locals {
  # Who may pull each VM's commands: an example VM's own account, or the account every member of
  # the example group shares (its template's, iam.tf).
  commands_subscribers = merge(
    { for name in var.mig_vm_names : name => google_service_account.mig_agent[0].email },
    { for name in var.vm_names : name => google_service_account.agent[name].email },
  )
}

module "vm_commands" {
  source   = "./modules/vm_commands_subscription"
  for_each = toset(local.commands_vm_names)

  project_id                  = var.project_id
  vm_name                     = each.value
  commands_topic_id           = google_pubsub_topic.commands[local.vm_commands_shards[each.value]].id
  agent_service_account_email = local.commands_subscribers[each.value]
  message_retention_duration  = var.commands_retention
}
