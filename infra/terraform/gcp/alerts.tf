# Log-based metrics of the functions' lines an operator must act on (docs/operations.md, the `alert`
# field): each such line counts once, by the VM it names. They count whatever the deployment's
# notification channels are; an alert policy on them (Cloud Monitoring, a condition on the metric's
# rate) is the deployment's own to add, with its channels.

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
