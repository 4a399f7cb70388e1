# ---------------------------------------------------------------- where

variable "project_id" {
  description = "Google Cloud project that holds everything: topics, subscriptions, the function, Firestore, the example VMs."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project_id))
    error_message = "project_id must be a project ID (6-30 lowercase letters, digits or hyphens, starting with a letter), not a project number or name."
  }
}

variable "region" {
  description = "Region of the function, its source bucket and Cloud NAT (e.g. europe-west1)."
  type        = string
  default     = "europe-west1"

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+$", var.region))
    error_message = "region must be a Compute region such as europe-west1 or us-central1."
  }
}

variable "zone" {
  description = "Zone of the example VMs and of their unmanaged instance group; it must be in var.region."
  type        = string
  default     = "europe-west1-b"

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]$", var.zone))
    error_message = "zone must be a Compute zone such as europe-west1-b."
  }
}

variable "labels" {
  description = "Labels put on every resource that takes labels (provider default_labels)."
  type        = map(string)
  default = {
    app = "maintenance-bridge"
  }

  validation {
    condition = alltrue([
      for key, value in var.labels : can(regex("^[a-z][a-z0-9_-]{0,62}$", key)) && can(regex("^[a-z0-9_-]{0,63}$", value))
    ])
    error_message = "label keys must start with a lowercase letter; keys and values may hold lowercase letters, digits, '_' and '-' (63 characters at most)."
  }
}

variable "enable_apis" {
  description = "Enable the Google APIs this deployment uses. Turn off when the project's APIs are managed elsewhere."
  type        = bool
  default     = true
}

# ---------------------------------------------------------------- Pub/Sub

variable "kms_key_name" {
  description = "Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K) to encrypt the topics with (CMEK). null: Google-managed encryption. The Pub/Sub service agent is granted encrypt/decrypt on this key only."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_name == null || can(regex("^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$", var.kms_key_name))
    error_message = "kms_key_name must be null or projects/P/locations/L/keyRings/R/cryptoKeys/K."
  }
}

variable "max_delivery_attempts" {
  description = "Deliveries of one event to the function before Pub/Sub moves it to maintenance-events-dead. With the 10 s to 600 s backoff, 10 attempts take about 40 minutes."
  type        = number
  default     = 10

  validation {
    condition     = var.max_delivery_attempts >= 5 && var.max_delivery_attempts <= 20 && floor(var.max_delivery_attempts) == var.max_delivery_attempts
    error_message = "max_delivery_attempts must be a whole number from 5 to 20: fewer dead-letters events on a short outage, more keeps a broken configuration retrying for hours."
  }
}

variable "commands_shards" {
  description = "How many commands topics the VMs are spread over: maintenance-commands, maintenance-commands-1, ... (MBRIDGE_COMMANDS_SHARDS; the shard of a VM is SHA-256 of its lower-cased name, `mbridge commands-entity`). Pub/Sub allows 10,000 attached subscriptions per topic (https://cloud.google.com/pubsub/quotas, \"Resource limits\"): the plan refuses a count too small for fleet_size. Change it outside a maintenance wave: commands waiting on an old subscription are not read again."
  type        = number
  default     = 1

  validation {
    condition     = var.commands_shards >= 1 && var.commands_shards <= 1024 && floor(var.commands_shards) == var.commands_shards
    error_message = "commands_shards must be a whole number from 1 to 1024."
  }
}

variable "fleet_size" {
  description = "How many VMs this deployment serves (each with a commands subscription), for the quota checks of the plan. Pub/Sub allows 10,000 attached subscriptions per topic and 10,000 subscriptions per project, a hard limit (https://cloud.google.com/pubsub/quotas, \"Resource limits\"): past the project's, split the fleet over deployments in several projects."
  type        = number
  default     = 1000

  validation {
    condition     = var.fleet_size >= 1 && floor(var.fleet_size) == var.fleet_size
    error_message = "fleet_size must be a whole number of VMs, at least 1."
  }
}

variable "commands_retention" {
  description = "How long a VM's command subscription keeps an undelivered command (e.g. 900s). Commands expire 10 minutes after they are issued, so keeping them longer only delivers commands the agent rejects."
  type        = string
  default     = "900s"

  validation {
    condition     = can(regex("^[0-9]+s$", var.commands_retention)) && try(tonumber(trimsuffix(var.commands_retention, "s")) >= 600 && tonumber(trimsuffix(var.commands_retention, "s")) <= 1200, false)
    error_message = "commands_retention must be between 600s (Pub/Sub's minimum) and 1200s, written like 900s."
  }
}

variable "operator_members" {
  description = "Principals that run `mbridge approve` (e.g. group:sre@example.com): publisher on maintenance-commands and subscriber on operator-results, nothing else."
  type        = list(string)
  default     = []

  validation {
    condition = alltrue([
      for member in var.operator_members : can(regex("^(user|group|serviceAccount|domain|principal|principalSet):.+$", member))
    ])
    error_message = "operator_members must be IAM principals such as user:ana@example.com or group:sre@example.com; allUsers and allAuthenticatedUsers are refused."
  }
}

variable "grant_pubsub_token_creator" {
  description = "Grant the Pub/Sub service agent roles/iam.serviceAccountTokenCreator on the push-invoker service account. Only projects that enabled Pub/Sub before 8 April 2021 need it to mint the push subscription's OIDC tokens."
  type        = bool
  default     = false
}

# ---------------------------------------------------------------- the function

variable "function_name" {
  description = "Name of the Cloud Function (gen2) that handles maintenance events; its Cloud Run service and its Artifact Registry repository have the same name, and the control plane's functions are <name>-central-log and <name>-central-tick."
  type        = string
  default     = "mbridge-events"

  validation {
    # 50 at most: <name>-central-tick (central.tf) must still be a function name, 63 at most
    # (https://cloud.google.com/functions/docs/deploying).
    condition     = can(regex("^[a-z][a-z0-9-]{0,48}[a-z0-9]$", var.function_name))
    error_message = "function_name must be lowercase letters, digits and hyphens, start with a letter and be at most 50 characters (the control plane's functions add -central-tick, and function names stop at 63)."
  }
}

variable "function_concurrency" {
  description = "Events one function instance handles at once (Cloud Run's max_instance_request_concurrency, one vCPU). A drain through an instance group holds its invocation for the group operation, so a wave needs instances x this above the drains it makes at once (docs/scale.md)."
  type        = number
  default     = 16

  validation {
    condition     = var.function_concurrency >= 1 && var.function_concurrency <= 80 && floor(var.function_concurrency) == var.function_concurrency
    error_message = "function_concurrency must be a whole number from 1 to 80."
  }
}

variable "function_max_instances" {
  description = "Most function instances at once, each handling function_concurrency events at a time; an invocation may wait minutes for another's claim, so keep instances x concurrency above the number of events that can arrive together."
  type        = number
  default     = 20

  validation {
    condition     = var.function_max_instances >= 1 && var.function_max_instances <= 100 && floor(var.function_max_instances) == var.function_max_instances
    error_message = "function_max_instances must be a whole number from 1 to 100."
  }
}

variable "source_bucket_name" {
  description = "Bucket for the function's source zip. null: <project_id>-mbridge-function-source."
  type        = string
  default     = null

  validation {
    condition     = var.source_bucket_name == null || can(regex("^[a-z0-9][a-z0-9_.-]{1,61}[a-z0-9]$", var.source_bucket_name))
    error_message = "source_bucket_name must be a valid bucket name: 3-63 lowercase letters, digits, '-', '_' or '.'."
  }
}

variable "policy" {
  description = "MBRIDGE_POLICY: the decision policy as JSON (or YAML); empty uses the default policy. See docs/policy.md."
  type        = string
  default     = ""
}

variable "log_level" {
  description = "MBRIDGE_LOG_LEVEL of the function's mbridge.* loggers."
  type        = string
  default     = "INFO"

  validation {
    condition     = contains(["DEBUG", "INFO", "WARNING", "ERROR"], var.log_level)
    error_message = "log_level must be DEBUG, INFO, WARNING or ERROR."
  }
}

variable "telemetry" {
  description = "MBRIDGE_TELEMETRY: off, or gcp for a span in Cloud Trace and metrics in Cloud Monitoring of each invocation (docs/operations.md#telemetry). With gcp, the function's runtime account gets roles/cloudtrace.agent and roles/monitoring.metricWriter on the project, and the two APIs are enabled (with enable_apis)."
  type        = string
  default     = "off"

  validation {
    condition     = contains(["off", "gcp"], var.telemetry)
    error_message = "telemetry must be off or gcp."
  }
}

variable "readiness_drain" {
  description = "MBRIDGE_READINESS_DRAIN: also drain through the agents' /readyz (drain/restore commands), for health-check based load balancing."
  type        = bool
  default     = true
}

variable "extra_instance_groups" {
  description = "Unmanaged instance groups to drain besides the example's, as zone/name (e.g. europe-west1-c/web-c)."
  type        = list(string)
  default     = []

  validation {
    condition = alltrue([
      for group in var.extra_instance_groups : can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]/[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", group))
    ])
    error_message = "extra_instance_groups entries must be zone/name, e.g. europe-west1-c/web-c."
  }
}

variable "extra_maintenance_zones" {
  description = "Zones of VMs outside the instance groups for performMaintenance (MBRIDGE_MAINTENANCE_ZONES); the groups' zones are always included."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for zone in var.extra_maintenance_zones : can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]$", zone))])
    error_message = "extra_maintenance_zones entries must be zones such as europe-west1-c."
  }
}

variable "central_reports" {
  description = "The control plane's path (docs/gcp.md): a log sink of the project's Compute Engine host-maintenance system events into the Pub/Sub topic maintenance-central, pushed to the function on_central_log_entry; a Cloud Scheduler job each minute on maintenance-central-tick, pushed to on_central_tick (the instances' upcomingMaintenance of trust_projects, the silent-agent sweep). false: none of it."
  type        = bool
  default     = true
}

variable "trust_projects" {
  description = "Projects whose VMs may report (MBRIDGE_TRUST_PROJECTS): a report is acted on only with an identity token of a VM of one of them. Empty: project_id."
  type        = list(string)
  default     = []

  validation {
    # Settings.py's rule: a project id, domain-scoped ones (example.com:my-project) included.
    condition     = alltrue([for project in var.trust_projects : can(regex("^(?:[a-z0-9][-a-z0-9.]{0,61}[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$", project))])
    error_message = "trust_projects holds project ids (6-30 lowercase letters, digits or hyphens, starting with a letter), not names or numbers."
  }
}

variable "identity_audience" {
  description = "The audience the agents ask their VM's identity tokens for and the function accepts: MBRIDGE_IDENTITY_AUDIENCE of the example VMs and MBRIDGE_TRUST_AUDIENCE of the function. null: maintenance-bridge/<project_id>/<function_name>, this deployment's own, so that a token made for another deployment (whose topic it may be lifted from) is not accepted here. Agents outside the example need the same value (output identity_audience)."
  type        = string
  default     = null

  validation {
    # Settings.py's rule; it is also one line of the agents' environment file.
    condition     = var.identity_audience == null || can(regex("^\\S{1,512}$", var.identity_audience))
    error_message = "identity_audience must be 1-512 characters without spaces, or null for the deployment's own."
  }
}

variable "trust_zones" {
  description = "Zones whose VMs may report (MBRIDGE_TRUST_ZONES), within trust_projects. Empty: every zone. A VM name must be carried by one instance only in the trusted projects and zones; narrow them when other instances share your VMs' names."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for zone in var.trust_zones : can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]$", zone))])
    error_message = "trust_zones entries must be zones such as europe-west1-c."
  }
}

variable "signing_key_secret_id" {
  description = "A Secret Manager secret of your own (id in this project) holding the Ed25519 private key that signs commands (MBRIDGE_SIGNING_KEY), with its public key in verify_key. null: a key pair is generated and its private key stored in the secret mbridge-signing-key (signing.tf)."
  type        = string
  default     = null

  validation {
    condition     = var.signing_key_secret_id == null || can(regex("^[A-Za-z0-9_-]{1,255}$", var.signing_key_secret_id))
    error_message = "signing_key_secret_id must be a secret id (letters, digits, '_' or '-'), not a full resource path."
  }
}

variable "webhook_url_secret_id" {
  description = "A Secret Manager secret of your own (id in this project) holding the webhook URL the function posts a notice of each decision and action to (MBRIDGE_WEBHOOK_URL, docs/operations.md#notifications); the URL holds the webhook's key, so it is never a plain variable. null: no notices. The function's runtime account gets secretAccessor on it."
  type        = string
  default     = null

  validation {
    condition     = var.webhook_url_secret_id == null || can(regex("^[A-Za-z0-9_-]{1,255}$", var.webhook_url_secret_id))
    error_message = "webhook_url_secret_id must be a secret id (letters, digits, '_' or '-'), not a full resource path."
  }
}

variable "webhook_template" {
  description = "MBRIDGE_WEBHOOK_TEMPLATE: the JSON body of each notice, with $${placeholders} (docs/operations.md#notifications); empty for the default, {\"text\": \"$${summary}\"}, which Slack and Teams incoming webhooks take."
  type        = string
  default     = ""
}

variable "webhook_actions" {
  description = "MBRIDGE_WEBHOOK_ACTIONS: which audit records are posted, comma-separated (docs/operations.md#notifications); empty for the default (decisions, actions and refusals)."
  type        = string
  default     = ""
}

variable "signing_key_secret_version" {
  description = "Version of signing_key_secret_id the function mounts: a number, or latest (picked up by new instances). A generated key's version is pinned."
  type        = string
  default     = "latest"

  validation {
    condition     = can(regex("^(latest|[1-9][0-9]*)$", var.signing_key_secret_version))
    error_message = "signing_key_secret_version must be latest or a version number."
  }
}

# ---------------------------------------------------------------- alerts

variable "alert_notification_channels" {
  description = "Cloud Monitoring notification channels (projects/P/notificationChannels/ID) every alert policy of alerts.tf notifies: a backlog on the functions' subscriptions, unread dead letters, the functions' alert lines. Empty: the policies exist without channels, their incidents shown in Cloud Monitoring only."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for channel in var.alert_notification_channels : can(regex("^projects/[^/]+/notificationChannels/[^/]+$", channel))])
    error_message = "alert_notification_channels entries must be notification channel names, projects/P/notificationChannels/ID."
  }
}

variable "alert_oldest_unacked_seconds" {
  description = "Age in seconds of the oldest unacknowledged message on a subscription feeding a function (maintenance-events-functions, maintenance-central-functions) past which, for 5 minutes, the backlog alert fires. The default, 900, lets a message through a few retries (10 s to 600 s backoff) but not the whole way to its dead letter (about 40 minutes with 10 attempts)."
  type        = number
  default     = 900

  validation {
    condition     = var.alert_oldest_unacked_seconds >= 60 && floor(var.alert_oldest_unacked_seconds) == var.alert_oldest_unacked_seconds
    error_message = "alert_oldest_unacked_seconds must be a whole number of seconds, at least 60."
  }
}

# ---------------------------------------------------------------- Firestore

variable "firestore_location" {
  description = "Location of the Firestore database: a multi-region (eur3, nam5) or a region (europe-west1). It cannot be changed later."
  type        = string
  default     = "eur3"

  validation {
    condition     = can(regex("^([a-z]+[0-9]+|[a-z]+-[a-z]+[0-9]+)$", var.firestore_location))
    error_message = "firestore_location must be a Firestore location such as eur3, nam5 or europe-west1."
  }
}

variable "firestore_database_name" {
  description = "Firestore (Native mode) database for state and audit. A named database keeps clear of a project's (default) one."
  type        = string
  default     = "mbridge"

  validation {
    condition     = var.firestore_database_name == "(default)" || can(regex("^[a-z][a-z0-9-]{2,61}[a-z0-9]$", var.firestore_database_name))
    error_message = "firestore_database_name must be (default) or 4-63 lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "firestore_collection_prefix" {
  description = "MBRIDGE_FIRESTORE_COLLECTION_PREFIX: prefix of every collection, so that two deployments can share a database. The indexes and the TTL field follow it."
  type        = string
  default     = "mbridge_"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{0,64}$", var.firestore_collection_prefix))
    error_message = "firestore_collection_prefix may hold up to 64 letters, digits, '_' or '-'."
  }
}

# ---------------------------------------------------------------- the example VMs

variable "vm_names" {
  description = "Names of the example VMs running the agent. Each gets its own service account and command subscription maintenance-commands-<name>."
  type        = list(string)
  default     = ["mbridge-vm-0", "mbridge-vm-1"]

  validation {
    # 2 to 26 characters: the VM's service account is mba-<name>, and account ids take 6 to 30.
    condition     = alltrue([for name in var.vm_names : can(regex("^[a-z][-a-z0-9]{0,24}[a-z0-9]$", name))]) && length(distinct(var.vm_names)) == length(var.vm_names)
    error_message = "vm_names must be distinct, lowercase letters, digits and hyphens, start with a letter, end with a letter or digit and be 2 to 26 characters (each VM's service account is mba-<name>, 6 to 30 characters)."
  }
}

variable "machine_type" {
  description = "Machine type of the example VMs."
  type        = string
  default     = "e2-small"
}

variable "vm_image" {
  description = "Boot image of the example VMs (Debian 12 by default; the startup script needs systemd and python3 >= 3.9)."
  type        = string
  default     = "debian-cloud/debian-12"
}

variable "network" {
  description = "VPC network of the example VMs and of the health-check firewall rule."
  type        = string
  default     = "default"
}

variable "subnetwork" {
  description = "Subnetwork of the example VMs in var.region; null takes the network's subnet of that region (auto-mode networks)."
  type        = string
  default     = null
}

variable "create_cloud_nat" {
  description = "Create a Cloud Router and Cloud NAT in var.region so the VMs, which have no external IP, can reach PyPI and Google APIs. Turn off when the network already has NAT."
  type        = bool
  default     = true
}

variable "vm_network_tags" {
  description = "Network tags of the example VMs; the health-check firewall rule targets them."
  type        = list(string)
  default     = ["mbridge-agent"]

  validation {
    condition     = length(var.vm_network_tags) > 0 && alltrue([for tag in var.vm_network_tags : can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", tag))])
    error_message = "vm_network_tags needs at least one tag of lowercase letters, digits and hyphens."
  }
}

variable "instance_group_name" {
  description = "Name of the example unmanaged instance group that holds the VMs (the group the function drains)."
  type        = string
  default     = "mbridge-example"

  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.instance_group_name))
    error_message = "instance_group_name must be lowercase letters, digits and hyphens and start with a letter."
  }
}

variable "agent_package" {
  description = "The agent the example VMs and the example group's members install (metadata mbridge-package): the agent's artifact, <URL of mbridge-agent-pubsub-X.Y.Z.pex>#sha256=<its 64 hex digits> (make agent-artifact writes both), which the installer checks before running anything from it (infra/agent/README.md). Required with vm_names or mig_vm_names; no default."
  type        = string
  default     = ""

  validation {
    # One line (an environment file's, a metadata value) carries the file and its hash: the form of
    # infra/agent/install-agent.sh that needs nothing else from the network. A value the installer
    # would refuse at the VMs' first boot fails the plan instead.
    condition     = var.agent_package == "" || can(regex("^(https|http|file)://[^\\s#]+\\.pex#sha256=[0-9A-Fa-f]{64}$", var.agent_package))
    error_message = "agent_package must be <https://, http:// or file:// URL of the agent's artifact, ending .pex>#sha256=<its 64 hex digits> (make agent-artifact, infra/agent/README.md): the installer takes no unpinned package."
  }
}

variable "verify_key" {
  description = "MBRIDGE_VERIFY_KEY of the agents with signing_key_secret_id: the Ed25519 public key of that signing key as one line (the raw 32-byte key as base64 or base64url, not PEM). Empty: the public key of the generated pair."
  type        = string
  default     = ""

  validation {
    # It is written into an environment file, one variable per line.
    condition     = length(regexall("[\\r\\n]", var.verify_key)) == 0
    error_message = "verify_key must be a single line (the raw public key as base64 or base64url); a PEM block would break the agent's environment file."
  }
}

# ---------------------------------------------------------------- the example managed instance group

variable "mig_vm_names" {
  description = "Names of the members of the example managed instance group (mig_example.tf), each made by name from the group's instance template, with its command subscription maintenance-commands-<name>. Empty (the default): no group, nothing of mig_example.tf is made. The members share one service account (the template's): docs/gcp.md#autohealers says what that opens."
  type        = list(string)
  default     = []

  validation {
    # Compute instance names; unlike vm_names no service account is named after them.
    condition     = alltrue([for name in var.mig_vm_names : can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", name))]) && length(distinct(var.mig_vm_names)) == length(var.mig_vm_names)
    error_message = "mig_vm_names must be distinct Compute instance names: lowercase letters, digits and hyphens, starting with a letter, not ending with a hyphen, 63 characters at most."
  }
}

variable "mig_name" {
  description = "Name of the example managed instance group, and the prefix of its instance templates, health checks and backend service."
  type        = string
  default     = "mbridge-mig"

  validation {
    # 30 at most: the templates are named <name>-<26 characters> (name_prefix), 63 at most.
    condition     = can(regex("^[a-z]([-a-z0-9]{0,28}[a-z0-9])?$", var.mig_name))
    error_message = "mig_name must be lowercase letters, digits and hyphens, start with a letter, not end with a hyphen and be 30 characters at most."
  }
}

variable "mig_autohealing_check" {
  description = "The HTTP check the example group autoheals on: the agent's /healthz on its health port (the default), or the application's own liveness. Never the agent's /readyz: a drain turns it unready on purpose, and the group would recreate every drained VM (the plan refuses it, as the functions refuse such a drain)."
  type = object({
    request_path = string
    port         = number
  })
  default = {
    request_path = "/healthz"
    port         = 9797
  }

  validation {
    condition     = startswith(var.mig_autohealing_check.request_path, "/") && var.mig_autohealing_check.port >= 1 && var.mig_autohealing_check.port <= 65535 && floor(var.mig_autohealing_check.port) == var.mig_autohealing_check.port
    error_message = "mig_autohealing_check needs a request_path starting with / and a port from 1 to 65535."
  }
}
