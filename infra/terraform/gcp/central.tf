# The control plane's path (docs/architecture.md, "Two paths"; docs/gcp.md): Google's own reports of
# host maintenance, beside the agents'. All of it hangs on var.central_reports.
#
#   Compute Engine system-event audit logs ──log sink (its own writer identity)──► topic maintenance-central
#       ──push subscription──► Cloud Function on_central_log_entry   (dead letters: maintenance-central-dead)
#   Cloud Scheduler, each minute ──► topic maintenance-central-tick
#       ──push subscription──► Cloud Function on_central_tick (instances' resourceStatus.upcomingMaintenance
#                              of the trusted projects, instances.aggregatedList; the silent-agent sweep)
#
# Both functions are built from the same source as the events function (function.tf), run as the
# same service account with the same settings, and are called by the same push invoker. Who may
# publish on each topic: docs/security.md, "Reports from the control plane".

locals {
  central_count = var.central_reports ? 1 : 0

  # Host-maintenance entries of the System Event audit log of the project's instances
  # (https://cloud.google.com/compute/docs/logging/audit-logging; the method names as Google's
  # system-event entries carry them).
  central_log_filter = join(" AND ", [
    "logName:\"cloudaudit.googleapis.com%2Fsystem_event\"",
    "resource.type=\"gce_instance\"",
    "protoPayload.methodName=(${join(" OR ", [for method in [
      "compute.instances.upcomingMaintenance",
      "compute.instances.migrateOnHostMaintenance",
      "compute.instances.terminateOnHostMaintenance",
      "compute.instances.hostError",
      "compute.instances.preempted",
      "compute.instances.automaticRestart",
    ] : "\"${method}\""])})",
  ])

  # The two functions of the path: their entry points in main.py, and how many instances each may
  # run. The tick's sweep runs one at a time: a tick that finds it busy is pushed again later.
  central_functions = var.central_reports ? {
    log = {
      name          = "${var.function_name}-central-log"
      entry_point   = "on_central_log_entry"
      description   = "maintenance-bridge: the control plane's reports of host maintenance (system-event audit logs)"
      max_instances = var.function_max_instances
      concurrency   = var.function_concurrency
    }
    tick = {
      name          = "${var.function_name}-central-tick"
      entry_point   = "on_central_tick"
      description   = "maintenance-bridge: each minute, the instances' upcomingMaintenance and the silent-agent sweep"
      max_instances = 1
      concurrency   = 1
    }
  } : {}

  # Cloud Scheduler's service agent publishes a Pub/Sub target's messages.
  cloud_scheduler_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-cloudscheduler.iam.gserviceaccount.com"
}

# ---------------------------------------------------------------- topics

resource "google_pubsub_topic" "central" {
  count        = local.central_count
  name         = "maintenance-central"
  kms_key_name = var.kms_key_name
  # A week of the log entries stays on the topic, so the subscription can be seeked back to replay.
  message_retention_duration = "604800s"

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.pubsub_cmek]
}

resource "google_pubsub_topic" "central_tick" {
  count        = local.central_count
  name         = "maintenance-central-tick"
  kms_key_name = var.kms_key_name
  # No retention: a tick is worth nothing once the next one is due.

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.pubsub_cmek]
}

resource "google_pubsub_topic" "central_dead_letters" {
  count        = local.central_count
  name         = "maintenance-central-dead"
  kms_key_name = var.kms_key_name
  # Reports nobody acted on: kept the longest Pub/Sub allows, as maintenance-events-dead.
  message_retention_duration = "2678400s"

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.pubsub_cmek]
}

# ---------------------------------------------------------------- the log sink

# The project's System Event audit log entries of host maintenance, as JSON LogEntry messages on
# maintenance-central. A writer identity of the sink's own (unique_writer_identity), which alone
# may publish there (below): the shared cloud-logs@system.gserviceaccount.com would let every
# sink of every project that was granted it write to the topic
# (https://registry.terraform.io/providers/hashicorp/google/latest/docs/resources/logging_project_sink).
resource "google_logging_project_sink" "central" {
  count       = local.central_count
  project     = var.project_id
  name        = "mbridge-maintenance-central"
  description = "maintenance-bridge: Compute Engine host-maintenance system events, to Pub/Sub maintenance-central"
  destination = "pubsub.googleapis.com/${google_pubsub_topic.central[0].id}"
  filter      = local.central_log_filter

  unique_writer_identity = true
}

# The topic's only publisher: the sink's writer identity (already "serviceAccount:...").
resource "google_pubsub_topic_iam_member" "central_sink_publisher" {
  count   = local.central_count
  project = var.project_id
  topic   = google_pubsub_topic.central[0].name
  role    = "roles/pubsub.publisher"
  member  = google_logging_project_sink.central[0].writer_identity
}

# ---------------------------------------------------------------- the tick

# Each minute, one message on maintenance-central-tick, published by Cloud Scheduler's service agent.
resource "google_cloud_scheduler_job" "central_tick" {
  count       = local.central_count
  project     = var.project_id
  region      = var.region
  name        = "mbridge-central-tick"
  description = "maintenance-bridge: each minute, read the instances' upcomingMaintenance and sweep for silent agents"
  schedule    = "* * * * *"
  time_zone   = "Etc/UTC"

  pubsub_target {
    topic_name = google_pubsub_topic.central_tick[0].id
    data       = base64encode("tick")
  }

  depends_on = [google_project_service.apis, google_pubsub_topic_iam_member.central_tick_publisher]
}

# Publisher on the tick topic for Cloud Scheduler's service agent. Its own role,
# roles/cloudscheduler.serviceAgent, already lets it publish to the project's topics; this binding
# keeps the job working where that project grant was narrowed.
resource "google_pubsub_topic_iam_member" "central_tick_publisher" {
  count   = local.central_count
  project = var.project_id
  topic   = google_pubsub_topic.central_tick[0].name
  role    = "roles/pubsub.publisher"
  member  = local.cloud_scheduler_service_agent
}

# ---------------------------------------------------------------- the functions

resource "google_cloudfunctions2_function" "central" {
  for_each = local.central_functions

  name        = each.value.name
  location    = var.region
  description = each.value.description

  # The events function's build, with another entry point of main.py.
  build_config {
    runtime           = "python311"
    entry_point       = each.value.entry_point
    service_account   = google_service_account.build.id
    docker_repository = google_artifact_registry_repository.function.id
    source {
      storage_source {
        bucket = google_storage_bucket.function_source.name
        object = google_storage_bucket_object.function_source.name
      }
    }
  }

  # No event_trigger: the push subscriptions below call the functions.

  service_config {
    # Within the push subscriptions' 600 s ack deadline, as the events function.
    timeout_seconds                  = 540
    available_memory                 = "512M"
    min_instance_count               = 0
    max_instance_count               = each.value.max_instances
    available_cpu                    = "1"
    max_instance_request_concurrency = each.value.concurrency
    ingress_settings                 = "ALLOW_INTERNAL_ONLY"
    all_traffic_on_latest_revision   = true
    service_account_email            = google_service_account.function.email

    environment_variables = merge(
      local.function_environment,
      local.function_policy_environment,
      { THREADS = tostring(each.value.concurrency) },
    )

    secret_environment_variables {
      key        = "MBRIDGE_SIGNING_KEY"
      project_id = var.project_id
      secret     = local.signing_key_secret_id
      version    = local.signing_key_secret_version
    }

    dynamic "secret_environment_variables" {
      for_each = var.webhook_url_secret_id == null ? [] : [var.webhook_url_secret_id]
      content {
        key        = "MBRIDGE_WEBHOOK_URL"
        project_id = var.project_id
        secret     = secret_environment_variables.value
        version    = "latest"
      }
    }
  }

  depends_on = [
    google_project_service.apis,
    google_secret_manager_secret_iam_member.signing_key,
    google_secret_manager_secret_iam_member.webhook_url,
    # The secret grants, once they have had time to take effect (iam.tf), as for the events function.
    time_sleep.secret_access,
    google_project_iam_member.build_log_writer,
    google_artifact_registry_repository_iam_member.build_writer,
    google_storage_bucket_iam_member.build_source_reader,
    google_project_iam_member.build_staged_source_reader,
  ]
}

# The push invoker may invoke these two services as well, and nothing else.
resource "google_cloud_run_v2_service_iam_member" "push_invoker_central" {
  for_each = google_cloudfunctions2_function.central

  project  = var.project_id
  location = each.value.location
  name     = each.value.service_config[0].service
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.push_invoker.email}"
}

# ---------------------------------------------------------------- push subscriptions

# As maintenance-events-functions (pubsub.tf): OIDC push as the push invoker, 600 s to answer,
# exponential retry, then dead letters.
resource "google_pubsub_subscription" "central" {
  count = local.central_count
  name  = "maintenance-central-functions"
  topic = google_pubsub_topic.central[0].id

  ack_deadline_seconds       = 600
  message_retention_duration = "604800s"
  enable_message_ordering    = false

  push_config {
    push_endpoint = "${google_cloudfunctions2_function.central["log"].service_config[0].uri}/${google_pubsub_topic.central[0].id}"

    oidc_token {
      service_account_email = google_service_account.push_invoker.email
      audience              = google_cloudfunctions2_function.central["log"].service_config[0].uri
    }
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.central_dead_letters[0].id
    max_delivery_attempts = var.max_delivery_attempts
  }

  expiration_policy {
    ttl = ""
  }

  depends_on = [
    google_cloud_run_v2_service_iam_member.push_invoker_central,
    google_pubsub_topic_iam_member.central_dead_letter_publisher,
  ]
}

# Each tick once. A tick the function does not take (a sweep still running, an error) is pushed
# again with backoff until it is 10 minutes old (the shortest retention Pub/Sub takes), then
# dropped: the next minute brings another, so a tick is never dead-lettered. Failures show in the
# function's logs.
resource "google_pubsub_subscription" "central_tick" {
  count = local.central_count
  name  = "maintenance-central-tick-functions"
  topic = google_pubsub_topic.central_tick[0].id

  ack_deadline_seconds       = 600
  message_retention_duration = "600s"
  enable_message_ordering    = false

  push_config {
    push_endpoint = "${google_cloudfunctions2_function.central["tick"].service_config[0].uri}/${google_pubsub_topic.central_tick[0].id}"

    oidc_token {
      service_account_email = google_service_account.push_invoker.email
      audience              = google_cloudfunctions2_function.central["tick"].service_config[0].uri
    }
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "60s"
  }

  expiration_policy {
    ttl = ""
  }

  depends_on = [google_cloud_run_v2_service_iam_member.push_invoker_central]
}

# Dead letters of the control plane's reports, kept readable for inspection and replay.
resource "google_pubsub_subscription" "central_dead_letters_inspect" {
  count                      = local.central_count
  name                       = "maintenance-central-dead-inspect"
  topic                      = google_pubsub_topic.central_dead_letters[0].id
  ack_deadline_seconds       = 60
  message_retention_duration = "604800s"
  retain_acked_messages      = true

  expiration_policy {
    ttl = ""
  }
}

# Pub/Sub's service agent moves what keeps failing to the dead-letter topic.
resource "google_pubsub_topic_iam_member" "central_dead_letter_publisher" {
  count   = local.central_count
  project = var.project_id
  topic   = google_pubsub_topic.central_dead_letters[0].name
  role    = "roles/pubsub.publisher"
  member  = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "central_dead_letter_subscriber" {
  count        = local.central_count
  project      = var.project_id
  subscription = google_pubsub_subscription.central[0].name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}
