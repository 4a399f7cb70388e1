# The Cloud Function (gen2) that handles maintenance events (docs/gcp.md).

locals {
  repo_root = abspath("${path.module}/../../..")

  # The function's zip holds what scripts/build_function_package.py puts in dist/function-gcp.zip: main.py,
  # the packages it imports (wire/ and functions/ but the Azure and the local app) and, as its
  # requirements.txt, the Cloud Function's lock requirements/gcp.txt (`make locks`; the root
  # requirements.txt is the Azure app's). It is listed file by file, so that nothing else of the
  # repository can get in. tests/infra/test_terraform_gcp.py keeps the two the same.
  function_source_packages = ["wire", "functions"]
  # The Azure app and bus client, the local app, and the agent's transports (its factory and local
  # buses): what scripts/build_function_package.py leaves out of function-gcp.zip.
  function_source_left_out = [
    "functions/azure_app/",
    "wire/transports/servicebus/",
    "functions/local_app/",
    "wire/transports/factory.py",
    "wire/transports/local.py",
    "wire/transports/jsonl.py",
  ]
  # What a working tree may hold besides the sources: caches and local databases (RE2).
  function_source_skipped = "(^|/)__pycache__/|\\.(pyc|pyo|db|db-wal|db-shm)$"
  function_source_files = sort(flatten([
    for package in local.function_source_packages : [
      for file in fileset(local.repo_root, "${package}/**") : file
      if length(regexall(local.function_source_skipped, file)) == 0 && !anytrue([
        for prefix in local.function_source_left_out : startswith(file, prefix)
      ])
    ]
  ]))

  # The function's settings (functions/gcp_app/settings.py; docs/gcp.md lists them all).
  function_environment = {
    MBRIDGE_GCP_PROJECT                 = var.project_id
    MBRIDGE_FIRESTORE_DATABASE          = google_firestore_database.main.name
    MBRIDGE_FIRESTORE_COLLECTION_PREFIX = var.firestore_collection_prefix
    MBRIDGE_PUBSUB_COMMANDS_TOPIC       = google_pubsub_topic.commands[0].name
    # Commands of a VM go to the topic of its shard (commands_shards.tf).
    MBRIDGE_COMMANDS_SHARDS   = tostring(var.commands_shards)
    MBRIDGE_INSTANCE_GROUPS   = join(",", local.instance_groups)
    MBRIDGE_MAINTENANCE_ZONES = join(",", local.maintenance_zones)
    MBRIDGE_READINESS_DRAIN   = tostring(var.readiness_drain)
    MBRIDGE_LOG_LEVEL         = var.log_level
    MBRIDGE_TELEMETRY         = var.telemetry
    # Who may report (policy trust: attested, the default): an identity token of the one instance
    # of these projects and zones with the report's VM name, asked for this deployment's audience
    # (the agents' MBRIDGE_IDENTITY_AUDIENCE, vm_example.tf). Google's certificates come from the
    # code's default URL; MBRIDGE_TRUST_FILE is for local runs only and never deployed.
    MBRIDGE_TRUST_PROJECTS = join(",", local.trust_projects)
    MBRIDGE_TRUST_ZONES    = join(",", var.trust_zones)
    MBRIDGE_TRUST_AUDIENCE = local.identity_audience
    # Notices of decisions and actions (docs/operations.md#notifications): empty, the defaults;
    # the URL itself comes from its secret, below.
    MBRIDGE_WEBHOOK_TEMPLATE = var.webhook_template
    MBRIDGE_WEBHOOK_ACTIONS  = var.webhook_actions
  }
  # Where Cloud Functions keeps the sources of the region's functions (docs: "Build process overview").
  functions_sources_bucket = "gcf-v2-sources-${data.google_project.this.number}-${var.region}"
  trust_projects           = length(var.trust_projects) > 0 ? var.trust_projects : [var.project_id]
  # This deployment's own audience unless one is given: the shared default would accept tokens
  # made for any other deployment that trusts the same projects.
  identity_audience = coalesce(var.identity_audience, "maintenance-bridge/${var.project_id}/${var.function_name}")
  # Unset, the function uses its default policy (an empty value would be a malformed policy).
  function_policy_environment = var.policy == "" ? {} : { MBRIDGE_POLICY = var.policy }
}

data "archive_file" "function_source" {
  type        = "zip"
  output_path = "${path.module}/.terraform/mbridge-function-source.zip"

  source {
    content  = file("${local.repo_root}/main.py")
    filename = "main.py"
  }
  source {
    content  = file("${local.repo_root}/requirements/gcp.txt")
    filename = "requirements.txt"
  }
  dynamic "source" {
    for_each = local.function_source_files
    content {
      content  = file("${local.repo_root}/${source.value}")
      filename = source.value
    }
  }
}

resource "google_storage_bucket" "function_source" {
  #checkov:skip=CKV_GCP_62:holds only the function's build input, written by this deployment and read by Cloud Build; turn on Data Access audit logs for Cloud Storage if reads must be recorded
  name     = coalesce(var.source_bucket_name, "${var.project_id}-mbridge-function-source")
  location = var.region

  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  # Deleting the deployment must not fail on the uploaded zips, and nothing else is kept here.
  force_destroy = true

  versioning {
    enabled = true
  }

  # Every change of the code uploads a new object (its name holds the zip's hash) and Terraform
  # deletes the old one, which versioning keeps as a noncurrent version for a month.
  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 30
      with_state                 = "ARCHIVED"
    }
    action {
      type = "Delete"
    }
  }

  depends_on = [google_project_service.apis]
}

resource "google_storage_bucket_object" "function_source" {
  # The name changes with the content, so any change of the code deploys a new revision.
  name   = "function-source-${data.archive_file.function_source.output_md5}.zip"
  bucket = google_storage_bucket.function_source.name
  source = data.archive_file.function_source.output_path
}

# The function's images, in a repository of their own: the build account writes here and nowhere
# else, instead of to the shared gcf-artifacts repository Cloud Functions would otherwise create.
resource "google_artifact_registry_repository" "function" {
  #checkov:skip=CKV_GCP_84:holds only the function's images, rebuilt from the source bucket on every change; Google-managed encryption applies, and a customer key would also need a grant to Artifact Registry's service agent
  location      = var.region
  repository_id = var.function_name
  description   = "Images of the maintenance-bridge Cloud Function, built by Cloud Build"
  format        = "DOCKER"

  # Every code change builds a new image; only the recent ones can serve a rollback.
  cleanup_policies {
    id     = "keep-recent"
    action = "KEEP"
    most_recent_versions {
      keep_count = 5
    }
  }
  cleanup_policies {
    id     = "delete-older"
    action = "DELETE"
    condition {
      older_than = "2592000s"
    }
  }

  depends_on = [google_project_service.apis]
}

resource "google_cloudfunctions2_function" "events" {
  name        = var.function_name
  location    = var.region
  description = "maintenance-bridge: acts on host-maintenance events published by the VM agents"

  build_config {
    runtime     = "python311"
    entry_point = "on_maintenance_event"
    # A build account of our own (iam.tf), in the resource-name form the API takes:
    # projects/<project>/serviceAccounts/<email>, which is the account's id.
    service_account   = google_service_account.build.id
    docker_repository = google_artifact_registry_repository.function.id
    source {
      storage_source {
        bucket = google_storage_bucket.function_source.name
        object = google_storage_bucket_object.function_source.name
      }
    }
  }

  # No event_trigger: the push subscription maintenance-events-functions (pubsub.tf) calls the
  # function, so that its dead-letter policy can be managed here.

  service_config {
    # A redelivery may wait up to the claim lease plus 15 s for another invocation, then run the
    # Compute calls (docs/gcp.md). It must end within the push subscription's 600 s ack deadline
    # (Pub/Sub's maximum), or Pub/Sub delivers the message again while it still runs.
    timeout_seconds    = 540
    available_memory   = "512M"
    min_instance_count = 0
    max_instance_count = var.function_max_instances
    # Several events per instance: a drain waits on its instance-group operation, and one event at
    # a time per instance would make a wave wait for instances, not for work (docs/scale.md). The
    # core is written for concurrent invocations (the Azure app runs 16 per instance); Cloud Run
    # takes concurrency above 1 with a whole vCPU, and functions-framework's gunicorn serves it
    # with THREADS threads (its default: 4 per CPU).
    available_cpu                    = "1"
    max_instance_request_concurrency = var.function_concurrency
    # Pub/Sub push from this project is internal traffic for Cloud Run ingress; nothing else
    # needs to reach the function, and every request still needs the invoker role.
    ingress_settings               = "ALLOW_INTERNAL_ONLY"
    all_traffic_on_latest_revision = true
    service_account_email          = google_service_account.function.email

    environment_variables = merge(
      local.function_environment,
      local.function_policy_environment,
      { THREADS = tostring(var.function_concurrency) },
    )

    # The command signing key (signing.tf), never as plain text.
    secret_environment_variables {
      key        = "MBRIDGE_SIGNING_KEY"
      project_id = var.project_id
      secret     = local.signing_key_secret_id
      version    = local.signing_key_secret_version
    }

    # The webhook URL, when one is given: it holds the webhook's key.
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
    # The deployment checks that the runtime service account can read the secret it mounts.
    google_secret_manager_secret_iam_member.signing_key,
    google_secret_manager_secret_iam_member.webhook_url,
    # ... and has had time to take effect (iam.tf).
    time_sleep.secret_access,
    # The build runs as the build account: its roles must be in place before the first build.
    google_project_iam_member.build_log_writer,
    google_artifact_registry_repository_iam_member.build_writer,
    google_storage_bucket_iam_member.build_source_reader,
    google_project_iam_member.build_staged_source_reader,
  ]

  lifecycle {
    precondition {
      condition     = (var.signing_key_secret_id == null) == (var.verify_key == "")
      error_message = "signing_key_secret_id and verify_key go together: a signing key of your own needs its public key for the agents, and a generated one brings its own (leave both unset)."
    }
  }
}
