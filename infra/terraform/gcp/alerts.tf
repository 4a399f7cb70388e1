# What an operator must act on, as Cloud Monitoring alert policies, each notifying
# var.alert_notification_channels:
#   - backlog: the oldest unacknowledged message of a subscription that feeds a function is older
#     than var.alert_oldest_unacked_seconds (deliveries keep failing, or the function cannot keep up);
#   - dead_letters: a dead letter waits unread on a dead-letter inspection subscription;
#   - log_alert: a function logged a line with an `alert` field (docs/operations.md), counted by
#     the log-based metrics below, each line once, by the VM it names.
# With no channels (the default) the policies still exist: their incidents open and close in Cloud
# Monitoring, where they can be seen, and adding channels later updates them in place.

locals {
  alert_metrics = {
    agent_silent    = { alert = "agent-silent", what = "the control plane reported a VM's maintenance and the VM's own agent did not" }
    proof_reused    = { alert = "proof-reused", what = "a report whose proof was first seen with another key" }
    upcoming_unread = { alert = "upcoming-unread", what = "a tick could not list the instances' upcoming maintenance" }
  }
}

resource "google_logging_metric" "alert" {
  for_each    = local.alert_metrics
  project     = var.project_id
  name        = "mbridge/${each.key}"
  description = "maintenance-bridge: ${each.value.what} (log lines with alert=${each.value.alert})"
  # The functions' structured lines carry the field as a label (functions/gcp_app/logging.py).
  filter = join(" AND ", [
    "resource.type=\"cloud_run_revision\"",
    "labels.logger:\"mbridge.\"",
    "labels.alert=\"${each.value.alert}\"",
  ])

  metric_descriptor {
    metric_kind  = "DELTA"
    value_type   = "INT64"
    unit         = "1"
    display_name = "maintenance-bridge ${each.value.alert}"
    labels {
      key         = "vm"
      value_type  = "STRING"
      description = "the VM the line names"
    }
  }
  label_extractors = {
    vm = "EXTRACT(labels.vm)"
  }
}

locals {
  # The push subscriptions that feed the functions, and the subscriptions that keep dead letters.
  alert_backlog_subscriptions = merge(
    { events = google_pubsub_subscription.functions.name },
    var.central_reports ? { central = google_pubsub_subscription.central[0].name } : {},
  )
  alert_dead_letter_subscriptions = merge(
    { events = google_pubsub_subscription.dead_letters_inspect.name },
    var.central_reports ? { central = google_pubsub_subscription.central_dead_letters_inspect[0].name } : {},
  )
}

# A message stays unacknowledged while the function fails on it (Pub/Sub retries with a 10 s to
# 600 s backoff, then dead-letters it after max_delivery_attempts) or while the functions cannot
# keep up. pubsub.googleapis.com/subscription/oldest_unacked_message_age is sampled each minute
# (https://cloud.google.com/monitoring/api/metrics_gcp_p_z#gcp-pubsub).
resource "google_monitoring_alert_policy" "backlog" {
  for_each = local.alert_backlog_subscriptions

  project               = var.project_id
  display_name          = "maintenance-bridge: ${each.value} is falling behind"
  combiner              = "OR"
  severity              = "ERROR"
  notification_channels = var.alert_notification_channels

  conditions {
    display_name = "oldest unacked message older than ${var.alert_oldest_unacked_seconds} s"
    condition_threshold {
      filter          = "metric.type=\"pubsub.googleapis.com/subscription/oldest_unacked_message_age\" AND resource.type=\"pubsub_subscription\" AND resource.label.subscription_id=\"${each.value}\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.alert_oldest_unacked_seconds
      duration        = "300s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "A message on `${each.value}` has waited more than ${var.alert_oldest_unacked_seconds} s: the function keeps failing on it (its logs, docs/gcp.md \"Delivery, retries and dead letters\") or cannot keep up (docs/scale.md). Maintenance events are time-bound: an event not handled before its window is not drained."
  }
}

# A dead letter is an event (or a control-plane report) nobody acted on. The inspection
# subscription keeps it until it is read (and a week at most): the incident stays open until then.
resource "google_monitoring_alert_policy" "dead_letters" {
  for_each = local.alert_dead_letter_subscriptions

  project               = var.project_id
  display_name          = "maintenance-bridge: dead letters on ${each.value}"
  combiner              = "OR"
  severity              = "ERROR"
  notification_channels = var.alert_notification_channels

  conditions {
    display_name = "unread dead letters"
    condition_threshold {
      filter          = "metric.type=\"pubsub.googleapis.com/subscription/num_undelivered_messages\" AND resource.type=\"pubsub_subscription\" AND resource.label.subscription_id=\"${each.value}\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "Pub/Sub gave up delivering a message and moved it to the dead-letter topic; `${each.value}` holds it. Read it (`gcloud pubsub subscriptions pull ${each.value} --limit 5`), fix the cause, and replay it by publishing its data and attributes to its topic again (infra/terraform/gcp/README.md, \"Operating\")."
  }
}

# A new log-based metric can take up to 10 minutes to be known to Cloud Monitoring, and a policy
# on it is refused until then ("Cannot find metric(s) that match type", the API's answer;
# https://github.com/hashicorp/terraform-provider-google/issues/11102). The policies wait that
# long after the metrics are created or replaced; the wait runs beside the functions' builds.
resource "time_sleep" "log_metrics" {
  create_duration = "600s"

  triggers = {
    metrics = join(",", sort([for metric in google_logging_metric.alert : metric.id]))
  }
}

# Each counted alert line (the metrics above). A user-defined log-based metric is
# logging.googleapis.com/user/<its name> in Cloud Monitoring.
resource "google_monitoring_alert_policy" "log_alert" {
  for_each = google_logging_metric.alert

  project               = var.project_id
  display_name          = "maintenance-bridge: ${local.alert_metrics[each.key].alert}"
  combiner              = "OR"
  severity              = "WARNING"
  notification_channels = var.alert_notification_channels

  conditions {
    display_name = "a function logged alert=${local.alert_metrics[each.key].alert}"
    condition_threshold {
      filter          = "metric.type=\"logging.googleapis.com/user/${each.value.name}\" AND resource.type=\"cloud_run_revision\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.vm"]
      }
    }
  }

  alert_strategy {
    auto_close = "86400s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = "maintenance-bridge: ${local.alert_metrics[each.key].what}. The incident names the VM (label vm); the function's line has the details (docs/operations.md, the `alert` field)."
  }

  depends_on = [time_sleep.log_metrics]
}
