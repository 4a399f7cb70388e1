# Service accounts and every role they hold (docs/gcp.md "IAM", docs/transports.md "Roles").
# Roles are granted on the resource that needs them. At project level there are five bindings:
# Firestore (condition: one database), the drainer role (condition: the configured instance
# groups and zones), the instance reader in each trusted project (compute.instances.list alone,
# which is checked on the project), the build's source reader (condition: the function's source
# buckets) and the build's log writer, which Cloud Logging offers on no narrower resource.

# ---------------------------------------------------------------- service accounts

resource "google_service_account" "function" {
  account_id   = "mbridge-functions"
  display_name = "maintenance-bridge function runtime"
  description  = "Runs the Cloud Function: Firestore state and audit, commands to the agents, instance-group drains."

  depends_on = [google_project_service.apis]
}

resource "google_service_account" "push_invoker" {
  account_id   = "mbridge-push-invoker"
  display_name = "maintenance-bridge Pub/Sub push"
  description  = "Identity of the maintenance-events-functions push subscription: may invoke the function, nothing else."

  depends_on = [google_project_service.apis]
}

# Cloud Build runs the function's build as this account (function.tf build_config), not as the
# project's default compute or Cloud Build account: new organisations no longer grant those any
# build rights, and they hold far more than a build needs.
resource "google_service_account" "build" {
  account_id   = "mbridge-build"
  display_name = "maintenance-bridge function build"
  description  = "Builds the Cloud Function's image: reads its source, pushes to its repository, writes build logs."

  depends_on = [google_project_service.apis]
}

# One per VM: a subscription binding then admits exactly one VM, so no VM can read another's
# commands (docs/transports.md). A shared account would open every VM's subscription to every VM.
resource "google_service_account" "agent" {
  for_each = toset(var.vm_names)

  account_id   = "mba-${each.value}"
  display_name = "maintenance-bridge agent on ${each.value}"
  description  = "The agent on VM ${each.value}: publishes to maintenance-events, pulls its own command subscription."

  depends_on = [google_project_service.apis]
}

# The members of the example managed instance group (mig_example.tf) share this one: an instance
# template names a single service account, and a group makes every member from its template. So
# the subscriber binding on each member's subscription admits every member, unlike the example
# VMs' (docs/gcp.md#autohealers says what that opens and what it does not).
resource "google_service_account" "mig_agent" {
  count = local.mig_enabled ? 1 : 0

  account_id   = "mbridge-mig-agents"
  display_name = "maintenance-bridge agents of ${var.mig_name}"
  description  = "The agents on the members of the managed instance group ${var.mig_name}: publish to maintenance-events, pull the members' command subscriptions."

  depends_on = [google_project_service.apis]
}

# ---------------------------------------------------------------- the function's runtime account

# Firestore has no per-database IAM resource; the condition limits the grant to this database.
resource "google_project_iam_member" "function_firestore" {
  project = var.project_id
  role    = "roles/datastore.user"
  member  = "serviceAccount:${google_service_account.function.email}"

  condition {
    title       = "mbridge-firestore-database-only"
    description = "Only the maintenance-bridge Firestore database."
    expression  = "resource.name == \"projects/${var.project_id}/databases/${google_firestore_database.main.name}\""
  }
}

# With telemetry on (var.telemetry = "gcp"), and only then: the exporters' writes of spans to Cloud
# Trace and of metric points to Cloud Monitoring (functions/telemetry, docs/operations.md#telemetry).
# Both roles are project-wide: neither service has a narrower resource to grant them on.
resource "google_project_iam_member" "function_telemetry" {
  for_each = local.telemetry_roles
  project  = var.project_id
  role     = each.value
  member   = "serviceAccount:${google_service_account.function.email}"
}

# Publisher on every commands topic (one per shard).
resource "google_pubsub_topic_iam_member" "function_commands_publisher" {
  count   = var.commands_shards
  project = var.project_id
  topic   = google_pubsub_topic.commands[count.index].name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.function.email}"
}

# Exactly the permissions of the calls of functions/gcp_app/compute.py, as the Compute Engine API
# reference lists them (https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroups):
#   instanceGroups.listInstances           compute.instanceGroups.list on the group
#   instanceGroups.addInstances/remove...  compute.instanceGroups.update on the group, and
#                                          compute.instances.use on each instance of the request
#                                          (its instances[].instance field)
#   zoneOperations.wait                    compute.zoneOperations.get
#   instances.performMaintenance           compute.instances.performMaintenance on the instance
# Without compute.instances.use a drain could not be undone: the VM would stay out of its group.
resource "google_project_iam_custom_role" "drainer" {
  project     = var.project_id
  role_id     = "mbridgeDrainer"
  title       = "maintenance-bridge drainer"
  description = "Take VMs out of unmanaged instance groups and back, wait for those operations, start announced maintenance."
  permissions = [
    "compute.instanceGroups.list",
    "compute.instanceGroups.update",
    "compute.instances.use",
    "compute.zoneOperations.get",
    "compute.instances.performMaintenance",
  ]
}

locals {
  # The condition narrows the two resource types it can name: instance groups to exactly the
  # configured ones (list and update), instances to the zones they can be in. Those are the zones
  # of the configured groups (a group holds instances of its own zone only, and add/remove check
  # compute.instances.use on each of them) and the maintenance zones (performMaintenance).
  # Other resource types the role's permissions are checked on (zone operations, the project)
  # pass unnarrowed: IAM conditions document no resource names for them, and a guessed name
  # would refuse every call.
  drainer_group_names = [
    for group in local.instance_groups :
    "resource.name == \"projects/${var.project_id}/zones/${split("/", group)[0]}/instanceGroups/${split("/", group)[1]}\""
  ]
  drainer_instance_zones = distinct(concat([for group in local.instance_groups : split("/", group)[0]], local.maintenance_zones))
  drainer_zone_prefixes = [
    for zone in local.drainer_instance_zones :
    "resource.name.startsWith(\"projects/${var.project_id}/zones/${zone}/instances/\")"
  ]
  drainer_condition = join(" && ", [
    "(resource.type != \"compute.googleapis.com/InstanceGroup\" || ${join(" || ", local.drainer_group_names)})",
    "(resource.type != \"compute.googleapis.com/Instance\" || ${join(" || ", local.drainer_zone_prefixes)})",
  ])
}

resource "google_project_iam_member" "function_drainer" {
  project = var.project_id
  role    = google_project_iam_custom_role.drainer.name
  member  = "serviceAccount:${google_service_account.function.email}"

  condition {
    title       = "mbridge-configured-groups-and-zones"
    description = "Instance groups of MBRIDGE_INSTANCE_GROUPS; instances in their zones and in MBRIDGE_MAINTENANCE_ZONES."
    expression  = local.drainer_condition
  }
}

# Which instance a reported VM name stands for (functions/gcp_app/instance_directory.py): one
# instances.aggregatedList per trusted project, filtered by name, which needs
# compute.instances.list on the project and nothing else. The central tick (central.tf,
# on_central_tick) reads the instances' resourceStatus.upcomingMaintenance with the same call, so
# the same one permission serves it. roles/compute.viewer would also do, with
# get and list of every Compute resource; this role holds the one permission. It is made in each
# trusted project (a custom role belongs to its project), so the deployer needs
# iam.roles.create and setIamPolicy there too. List permissions are checked on the project, so a
# condition on instance names or zones would refuse the call: the zones are narrowed in the code
# (trust_zones).
#
# Before a drain through /readyz the functions read what autohealing the VM (functions/gcp_app/
# autohealer.py, docs/gcp.md#autohealers): the instance (its created-by metadata item), its managed
# instance group and the group's health checks, zonal, regional or global: four get permissions,
# reads only. And how long the load balancers take to see the drain (functions/gcp_app/
# probe_times.py, docs/gcp.md#probe-times): the backend services, global and regional, whose
# backends include that group, and their health checks (the same two get permissions): two list
# permissions more, checked on the project.
resource "google_project_iam_custom_role" "instance_reader" {
  for_each = toset(local.trust_projects)

  project     = each.value
  role_id     = "mbridgeInstanceReader"
  title       = "maintenance-bridge instance reader"
  description = "List the project's instances by name; read what autohealing an instance, and the health checks of its load balancers, before draining it through /readyz."
  permissions = [
    "compute.instances.list",
    "compute.instances.get",
    "compute.instanceGroupManagers.get",
    "compute.healthChecks.get",
    "compute.regionHealthChecks.get",
    "compute.backendServices.list",
    "compute.regionBackendServices.list",
  ]
}

resource "google_project_iam_member" "function_instance_reader" {
  for_each = toset(local.trust_projects)

  project = each.value
  role    = google_project_iam_custom_role.instance_reader[each.value].name
  member  = "serviceAccount:${google_service_account.function.email}"
}

# The command signing key (signing.tf): that one secret only.
resource "google_secret_manager_secret_iam_member" "signing_key" {
  project   = var.project_id
  secret_id = local.signing_key_secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.function.email}"
}

# The webhook URL of your own secret (webhook_url_secret_id), mounted as MBRIDGE_WEBHOOK_URL.
resource "google_secret_manager_secret_iam_member" "webhook_url" {
  count     = var.webhook_url_secret_id == null ? 0 : 1
  project   = var.project_id
  secret_id = var.webhook_url_secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.function.email}"
}

# A function's deployment checks that its runtime account can read every secret it mounts, and
# fails if not. A new grant usually takes effect within about two minutes, sometimes longer
# (https://cloud.google.com/iam/docs/access-change-propagation): the functions (function.tf,
# central.tf) deploy after this wait, which runs again whenever one of the grants is replaced.
resource "time_sleep" "secret_access" {
  create_duration = "120s"

  triggers = {
    signing_key = google_secret_manager_secret_iam_member.signing_key.id
    webhook_url = join(",", google_secret_manager_secret_iam_member.webhook_url[*].id)
  }
}

# No roles/logging.logWriter: a gen2 function is a Cloud Run service, whose stdout and stderr
# Cloud Logging collects without any role on the runtime account (the function logs JSON lines
# to stdout, functions/gcp_app/logging.py).

# ---------------------------------------------------------------- the function's build account

# The roles Google documents for a build service account of a function
# (https://cloud.google.com/functions/docs/securing/build-custom-sa): roles/logging.logWriter,
# roles/artifactregistry.writer, roles/storage.objectViewer; each on the narrowest resource it
# can be granted on.
resource "google_project_iam_member" "build_log_writer" {
  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = "serviceAccount:${google_service_account.build.email}"
}

# The function's own repository (function.tf build_config.docker_repository), not gcf-artifacts.
resource "google_artifact_registry_repository_iam_member" "build_writer" {
  project    = var.project_id
  location   = google_artifact_registry_repository.function.location
  repository = google_artifact_registry_repository.function.name
  role       = "roles/artifactregistry.writer"
  member     = "serviceAccount:${google_service_account.build.email}"
}

# The zip this deployment uploads, and the copy Cloud Functions keeps of it in its own source
# bucket of the region, gcf-v2-sources-<project number>-<region>
# (https://cloud.google.com/functions/docs/building). Storage names objects
# projects/_/buckets/<bucket>/objects/<object> in IAM conditions.
resource "google_storage_bucket_iam_member" "build_source_reader" {
  bucket = google_storage_bucket.function_source.name
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.build.email}"
}

resource "google_project_iam_member" "build_staged_source_reader" {
  project = var.project_id
  role    = "roles/storage.objectViewer"
  member  = "serviceAccount:${google_service_account.build.email}"

  condition {
    title       = "mbridge-function-sources-only"
    description = "Only the Cloud Functions source bucket of the function's region."
    # The bucket (objects.list) and its objects (objects.get), and no bucket whose name merely starts alike.
    expression = "resource.name == \"projects/_/buckets/${local.functions_sources_bucket}\" || resource.name.startsWith(\"projects/_/buckets/${local.functions_sources_bucket}/\")"
  }
}

# ---------------------------------------------------------------- invoking the function

# Gen2 invocations are authorised by Cloud Run: run.invoker on the function's service, and on
# nothing else.
resource "google_cloud_run_v2_service_iam_member" "push_invoker" {
  project  = var.project_id
  location = google_cloudfunctions2_function.events.location
  name     = google_cloudfunctions2_function.events.service_config[0].service
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.push_invoker.email}"
}

# ---------------------------------------------------------------- Pub/Sub's service agent

# Google creates a service agent when its API is enabled or first used, and not always before the
# next call: on a fresh project a binding to service-<number>@gcp-sa-pubsub can fail because the
# account does not exist yet. services.generateServiceIdentity creates it now, or returns it if it
# exists (https://cloud.google.com/iam/docs/create-service-agents); every grant below names it
# through this resource (local.pubsub_service_agent). google-beta only: the google provider does
# not carry it. Destroying it is a no-op: the agent stays with the project.
resource "google_project_service_identity" "pubsub" {
  provider = google-beta

  project = var.project_id
  service = "pubsub.googleapis.com"

  depends_on = [google_project_service.apis]
}

# Dead-lettering: the service agent republishes the message to the dead-letter topic and
# acknowledges it on the source subscription.
resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.dead_letters.name
  role    = "roles/pubsub.publisher"
  member  = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "dead_letter_subscriber" {
  project      = var.project_id
  subscription = google_pubsub_subscription.functions.name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}

# Projects that enabled Pub/Sub before 8 April 2021 need the service agent to be able to mint
# OIDC tokens for push; newer projects do not (var.grant_pubsub_token_creator).
resource "google_service_account_iam_member" "pubsub_token_creator" {
  count = var.grant_pubsub_token_creator ? 1 : 0

  service_account_id = google_service_account.push_invoker.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_service_agent
}

# CMEK topics: the service agent encrypts and decrypts their messages, with this key only.
resource "google_kms_crypto_key_iam_member" "pubsub_cmek" {
  count = var.kms_key_name == null ? 0 : 1

  crypto_key_id = var.kms_key_name
  role          = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
  member        = local.pubsub_service_agent
}

# ---------------------------------------------------------------- the agents

# Each agent publishes its events; it pulls commands from its VM's subscription only (the
# subscriber binding is in modules/vm_commands_subscription). The agent's start-up check uses
# testIamPermissions, which needs no role, so nothing else is granted.
locals {
  # The accounts the agents run as: each example VM's own, by VM name, and the one the members of
  # the example group share, under a key no VM name can take.
  agent_accounts = merge(
    { for name, account in google_service_account.agent : name => account.email },
    { for account in google_service_account.mig_agent : "group ${var.mig_name}" => account.email },
  )
}

resource "google_pubsub_topic_iam_member" "agent_events_publisher" {
  for_each = local.agent_accounts

  project = var.project_id
  topic   = google_pubsub_topic.events.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${each.value}"
}

# A managed instance group creates and recreates its members (resizes, autohealing, rolling
# updates) as the project's Google APIs Service Agent, which must be able to act as the members'
# account. New projects give that agent roles/editor, which holds it; organisations that took the
# role away keep groups working with this grant, on the members' account only.
resource "google_service_account_iam_member" "mig_agent_user" {
  count = local.mig_enabled ? 1 : 0

  service_account_id = google_service_account.mig_agent[0].name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${data.google_project.this.number}@cloudservices.gserviceaccount.com"
}

# ---------------------------------------------------------------- operators (`mbridge approve`)

moved {
  from = google_pubsub_topic_iam_member.function_commands_publisher
  to   = google_pubsub_topic_iam_member.function_commands_publisher[0]
}

# Publisher on every commands topic: keyed by member for shard 0 (as before commands_shards), by
# member and topic for the others.
resource "google_pubsub_topic_iam_member" "operator_commands_publisher" {
  for_each = {
    for pair in setproduct(var.operator_members, range(var.commands_shards)) :
    (pair[1] == 0 ? pair[0] : "${pair[0]} ${local.commands_topic_names[pair[1]]}") => local.commands_topic_names[pair[1]]
  }

  project = var.project_id
  topic   = google_pubsub_topic.commands[index(local.commands_topic_names, each.value)].name
  role    = "roles/pubsub.publisher"
  member  = split(" ", each.key)[0]
}

resource "google_pubsub_subscription_iam_member" "operator_results_subscriber" {
  for_each = toset(var.operator_members)

  project      = var.project_id
  subscription = google_pubsub_subscription.operator_results.name
  role         = "roles/pubsub.subscriber"
  member       = each.value
}
