# ---------------------------------------------------------------- where

variable "subscription_id" {
  description = "Azure subscription to deploy into. null: the provider reads ARM_SUBSCRIPTION_ID (azurerm 4 requires one of the two)."
  type        = string
  default     = null

  validation {
    condition     = var.subscription_id == null || can(regex("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", var.subscription_id))
    error_message = "subscription_id must be a subscription GUID (00000000-0000-0000-0000-000000000000), or null."
  }
}

variable "resource_group_name" {
  description = "Existing resource group that receives everything (like a Bicep resource-group deployment). The drainer role is defined in it."
  type        = string

  validation {
    condition     = can(regex("^[-\\w.()]{0,89}[-\\w()]$", var.resource_group_name))
    error_message = "resource_group_name must be 1-90 letters, digits, '-', '_', '.', '(' or ')', not ending with '.'."
  }
}

variable "location" {
  description = "Azure region of every resource (it must offer Flex Consumption function apps). null: the resource group's region."
  type        = string
  default     = null
}

variable "name_prefix" {
  description = "Start of every resource name. It goes into the storage account name (lowercase letters and digits only, 24 at most with the 2-letter infix and the 8-character suffix) and the Service Bus namespace name, which must start with a letter."
  type        = string
  default     = "mbridge"

  validation {
    condition     = can(regex("^[a-z][a-z0-9]{2,10}$", var.name_prefix))
    error_message = "name_prefix must be 3-11 lowercase letters or digits and start with a letter."
  }
}

variable "tags" {
  description = "Tags put on every resource that takes tags."
  type        = map(string)
  default = {
    app = "maintenance-bridge"
  }
}

# ---------------------------------------------------------------- Service Bus

variable "servicebus_sku" {
  description = "Service Bus tier. Basic has no topics; Premium adds isolation and private endpoints (one messaging unit is deployed)."
  type        = string
  default     = "Standard"

  validation {
    condition     = contains(["Standard", "Premium"], var.servicebus_sku)
    error_message = "servicebus_sku must be Standard or Premium (Basic has no topics)."
  }
}

variable "events_duplicate_detection_window" {
  description = "How long the events topic remembers a MessageId (ISO 8601). A republished envelope within this window is dropped, so make it longer than the longest outage an agent's outbox should ride out."
  type        = string
  default     = "P1D"

  validation {
    # Service Bus accepts 20 s to 7 days; below 10 minutes an agent retrying after a short outage
    # could publish the same envelope twice.
    condition     = contains(["PT10M", "PT30M", "PT1H", "PT6H", "PT12H", "P1D", "P2D", "P3D", "P7D"], var.events_duplicate_detection_window)
    error_message = "events_duplicate_detection_window must be one of PT10M, PT30M, PT1H, PT6H, PT12H, P1D, P2D, P3D, P7D (10 minutes to 7 days)."
  }
}

variable "function_subscription_name" {
  description = "Name of the events topic's subscription that the function app consumes (MBRIDGE_EVENTS_SUBSCRIPTION)."
  type        = string
  default     = "functions"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._-]{0,48}[A-Za-z0-9]$|^[A-Za-z0-9]$", var.function_subscription_name)) && var.function_subscription_name != "operator-results"
    error_message = "function_subscription_name must be 1-50 letters, digits, '.', '_' or '-' (starting and ending with a letter or digit), and not operator-results."
  }
}

variable "commands_mode" {
  description = "How commands reach the agents. queue: one session per VM of a shared queue; the agents' identity may open any session, so a VM could read or take another VM's commands (it cannot forge them). topic: one subscription per VM of a commands topic, readable by that VM's own identity only (commands_subscription_vms, modules/vm_commands_subscription); for standalone VMs with identities of their own, as the VMs of a scale set share one. The example scale set is not deployed in topic mode."
  type        = string
  default     = "queue"

  validation {
    condition     = contains(["queue", "topic"], var.commands_mode)
    error_message = "commands_mode must be queue or topic."
  }
}

variable "commands_subscription_vms" {
  description = "Topic mode: the VMs to give a commands subscription (vm-<name>), as VM name (as Scheduled Events name it in Resources) => principal (object) id of that VM's own managed identity. Refused in queue mode, which would not isolate them."
  type        = map(string)
  default     = {}

  validation {
    # A subscription name takes 50 characters: "vm-" and at most 47 of the VM's name.
    condition = alltrue([
      for name, principal in var.commands_subscription_vms :
      can(regex("^[A-Za-z0-9][A-Za-z0-9._-]{0,46}$", name)) && can(regex("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", principal))
    ])
    error_message = "commands_subscription_vms maps VM names (1-47 letters, digits, '.', '_', '-') to principal ids (GUIDs)."
  }
}

variable "commands_shards" {
  description = "How many commands entities (queues, or topics in topic mode) the VMs are spread over: maintenance-commands, maintenance-commands-1, ... (MBRIDGE_COMMANDS_SHARDS; the shard of a VM is SHA-256 of its lower-cased name, `mbridge commands-entity`). Service Bus allows 2,000 subscriptions per topic and 5,000 concurrent receive requests per entity (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas): the plan refuses a count too small for fleet_size. Change it outside a maintenance wave: commands waiting in an old entity are not read again."
  type        = number
  default     = 1

  validation {
    condition     = var.commands_shards >= 1 && var.commands_shards <= 1024 && floor(var.commands_shards) == var.commands_shards
    error_message = "commands_shards must be a whole number from 1 to 1024."
  }
}

variable "fleet_size" {
  description = "How many VMs this deployment serves, for the quota checks of the plan: at the peak 30 % of them are engaged at once, each holding a receive on its commands entity and 2 AMQP connections. Service Bus allows 5,000 concurrent receive requests per entity, 5,000 AMQP connections per namespace and 2,000 subscriptions per topic (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas): past the connections, split the fleet over several deployments (resource groups)."
  type        = number
  default     = 1000

  validation {
    condition     = var.fleet_size >= 1 && floor(var.fleet_size) == var.fleet_size
    error_message = "fleet_size must be a whole number of VMs, at least 1."
  }
}

# ---------------------------------------------------------------- function app

variable "function_maximum_instance_count" {
  description = "Most Flex Consumption instances the function app scales out to. Each instance may wait minutes on another invocation's claim, so keep it above the number of events that arrive together."
  type        = number
  default     = 40

  validation {
    # 40 is Flex Consumption's lowest maximum instance count, as in the Bicep's @minValue and
    # Microsoft's Flex Consumption samples.
    condition     = var.function_maximum_instance_count >= 40 && var.function_maximum_instance_count <= 1000 && floor(var.function_maximum_instance_count) == var.function_maximum_instance_count
    error_message = "function_maximum_instance_count must be a whole number from 40 to 1000."
  }
}

variable "function_instance_memory_mb" {
  description = "Memory of each Flex Consumption instance in MB."
  type        = number
  default     = 2048

  validation {
    condition     = contains([512, 2048, 4096], var.function_instance_memory_mb)
    error_message = "function_instance_memory_mb must be 512, 2048 or 4096."
  }
}

variable "policy" {
  description = "MBRIDGE_POLICY: the decision policy as JSON (or YAML); empty uses the default policy. See docs/policy.md."
  type        = string
  default     = ""
}

variable "webhook_url" {
  description = "MBRIDGE_WEBHOOK_URL: where the functions post a notice of each decision and action (docs/operations.md#notifications); empty for none. It holds the webhook's key: give a Key Vault reference, @Microsoft.KeyVault(SecretUri=...), to a secret the function identity may read (output function_identity_principal_id), or the https URL itself, which then sits in the app settings and the state."
  type        = string
  default     = ""
  sensitive   = true
  validation {
    condition     = var.webhook_url == "" || startswith(var.webhook_url, "https://") || startswith(var.webhook_url, "@Microsoft.KeyVault(")
    error_message = "webhook_url must be empty, an https:// URL, or a Key Vault reference @Microsoft.KeyVault(SecretUri=...)."
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

variable "readiness_drain" {
  description = "MBRIDGE_READINESS_DRAIN: also drain through the agents' /readyz (drain/restore commands), for health-probe based load balancing."
  type        = bool
  default     = true
}

variable "telemetry" {
  description = "MBRIDGE_TELEMETRY: off, or azure-monitor for a span and metrics of each invocation in the deployment's Application Insights, sent with the function identity (docs/operations.md#telemetry). The identity holds Monitoring Metrics Publisher on the component either way: the Functions host sends its own logs there with it."
  type        = string
  default     = "off"

  validation {
    condition     = contains(["off", "azure-monitor"], var.telemetry)
    error_message = "telemetry must be off or azure-monitor."
  }
}

variable "log_retention_days" {
  description = "Days the Log Analytics workspace keeps the function app's telemetry."
  type        = number
  default     = 30

  validation {
    condition     = var.log_retention_days >= 30 && var.log_retention_days <= 730
    error_message = "log_retention_days must be between 30 and 730."
  }
}

variable "alert_action_group_id" {
  description = "Resource id of an action group (/subscriptions/.../providers/Microsoft.Insights/actionGroups/<name>) the dead-letter alert notifies. Empty: the alert is deployed and fires in Azure Monitor without notifying anyone (the deployment knows no receiver of yours); attach one later here or with an alert processing rule (docs/azure.md, \"Logs, audit and alerts\")."
  type        = string
  default     = ""

  validation {
    condition     = var.alert_action_group_id == "" || can(regex("(?i)^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\\.Insights/actionGroups/[^/]+$", var.alert_action_group_id))
    error_message = "alert_action_group_id must be empty or an action group's resource id: /subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.Insights/actionGroups/<name>."
  }
}

variable "trust_resource_groups" {
  description = "Resource groups (of this subscription) of the VMs that run the agent (MBRIDGE_TRUST_RESOURCE_GROUPS): the function looks an agent's attested vmId up there and gets Reader on each. Empty: resource_group_name. VMs in other subscriptions need Reader there, granted elsewhere."
  type        = list(string)
  default     = []

  validation {
    condition = alltrue([
      for group in var.trust_resource_groups : can(regex("^[-\\w.()]{0,89}[-\\w()]$", group))
    ]) && length(distinct([for group in var.trust_resource_groups : lower(group)])) == length(var.trust_resource_groups)
    error_message = "trust_resource_groups holds resource group names (1-90 letters, digits, '-', '_', '.', '(' or ')', not ending with '.'), not ids, each once (names compare case-insensitively)."
  }
}

variable "trust_subscriptions" {
  description = "Subscription ids whose VMs may report (MBRIDGE_TRUST_SUBSCRIPTIONS): a report is acted on only with an attested document of a VM of one of them. Empty: the subscription deployed into. Reader (trust_resource_groups) is granted in that subscription only."
  type        = list(string)
  default     = []

  validation {
    condition = alltrue([
      for subscription in var.trust_subscriptions : can(regex("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", subscription))
    ])
    error_message = "trust_subscriptions holds subscription ids (GUIDs such as 00000000-0000-0000-0000-000000000000)."
  }
}

# ---------------------------------------------------------------- storage

variable "storage_replication_type" {
  description = "Replication of the storage account that holds the state and audit tables and the function's package. GRS by default: the audit trail survives a regional outage; the tables are small, so the cost is too."
  type        = string
  default     = "GRS"

  validation {
    condition     = contains(["LRS", "ZRS", "GRS", "RAGRS", "GZRS", "RAGZRS"], var.storage_replication_type)
    error_message = "storage_replication_type must be one of LRS, ZRS, GRS, RAGRS, GZRS, RAGZRS."
  }
}

# ---------------------------------------------------------------- drain target (Azure Load Balancer)

variable "central_reports" {
  description = "The control plane's path (docs/azure.md, \"The control plane's reports\"): an Event Grid system topic of type Microsoft.ResourceNotifications.MaintenanceResources on the subscription, its subscription delivering ScheduledEventEmitted into the Service Bus queue maintenance-central with the topic's own identity, MBRIDGE_CENTRAL_QUEUE and MBRIDGE_CENTRAL_RECONCILE for the function app, and the example scale set's scheduled-events policy publishing to Event Grid and Resource Graph. A Microsoft preview: register the features SendScheduledEventsPolicy (Microsoft.Compute) and ScheduledEventsActivity (Microsoft.Maintenance) first (docs/deploy.md), or set false. One such system topic per subscription."
  type        = bool
  default     = true
}

variable "drain_load_balancer_name" {
  description = "Load balancer whose backend pools the function drains VMs from (MBRIDGE_LB_NAME). Empty: no load balancer is drained by the control plane, only through the agents' /readyz, and the drainer role is assigned nowhere."
  type        = string
  default     = ""

  validation {
    condition     = var.drain_load_balancer_name == "" || can(regex("^[A-Za-z0-9][A-Za-z0-9._-]{0,78}[A-Za-z0-9_]$|^[A-Za-z0-9]$", var.drain_load_balancer_name))
    error_message = "drain_load_balancer_name must be empty or a load balancer name (1-80 letters, digits, '.', '_' or '-')."
  }
}

variable "drain_method" {
  description = "How a VM is taken out of the drain load balancer (MBRIDGE_LB_DRAIN, docs/azure.md \"Admin state or pool edits\"): admin-state sets its backend pool entries Down (no new connections, established ones kept; reaches uniform scale sets; the role writes backend pools only, never a NIC); pool-edit rewrites its NICs' and pools' memberships (the role also writes NICs and joins what they link to). Change it outside a maintenance wave: a drain is restored with the permissions of the method that made it."
  type        = string
  default     = "admin-state"

  validation {
    condition     = contains(["admin-state", "pool-edit"], var.drain_method)
    error_message = "drain_method is admin-state or pool-edit."
  }
}

variable "drain_load_balancer_resource_group" {
  description = "Resource group of the drain load balancer (MBRIDGE_LB_RESOURCE_GROUP), in this subscription. Empty: var.resource_group_name."
  type        = string
  default     = ""
}

variable "drain_nic_resource_group" {
  description = "Resource group searched for the VMs' NICs (MBRIDGE_LB_NIC_RESOURCE_GROUP); the drainer role is assigned on it. Empty: the load balancer's resource group."
  type        = string
  default     = ""
}

variable "drain_virtual_network_name" {
  description = "Virtual network of the drained VMs; the drainer role is assigned on it (NIC writes join its subnet, IP-based pools join the network). Required when drain_load_balancer_name is set."
  type        = string
  default     = ""
}

variable "drain_virtual_network_resource_group" {
  description = "Resource group of that virtual network. Empty: the load balancer's resource group."
  type        = string
  default     = ""
}

variable "drainer_role_name" {
  description = "Name of the custom drainer role. Custom role names are unique in a tenant: give a second deployment in the same tenant its own name."
  type        = string
  default     = "Maintenance Bridge Drainer"

  validation {
    condition     = length(var.drainer_role_name) > 0 && length(var.drainer_role_name) <= 512
    error_message = "drainer_role_name must be 1-512 characters."
  }
}

# ---------------------------------------------------------------- example scale set running the agent

variable "deploy_example_scale_set" {
  description = "Deploy the example: a Linux scale set running the agent behind an internal load balancer that probes /readyz, in a new virtual network. Queue mode only (commands_mode): its VMs share one identity."
  type        = bool
  default     = true
}

variable "terminate_not_before_timeout" {
  description = "How long a scale-in or delete of an example VM waits for its Terminate event to be approved (the event's NotBefore), ISO 8601."
  type        = string
  default     = "PT10M"

  validation {
    # Azure accepts 5 to 15 minutes, in whole minutes.
    condition     = contains(["PT5M", "PT6M", "PT7M", "PT8M", "PT9M", "PT10M", "PT11M", "PT12M", "PT13M", "PT14M", "PT15M"], var.terminate_not_before_timeout)
    error_message = "terminate_not_before_timeout must be PT5M to PT15M in whole minutes (e.g. PT10M)."
  }
}

variable "scale_set_sku" {
  description = "VM size of the example scale set."
  type        = string
  default     = "Standard_B2s"
}

variable "scale_set_instances" {
  description = "Number of VMs in the example scale set."
  type        = number
  default     = 2

  validation {
    condition     = var.scale_set_instances >= 1 && var.scale_set_instances <= 100 && floor(var.scale_set_instances) == var.scale_set_instances
    error_message = "scale_set_instances must be a whole number from 1 to 100."
  }
}

variable "admin_username" {
  description = "Admin user of the example VMs (SSH key only, no password)."
  type        = string
  default     = "azureuser"

  validation {
    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.admin_username)) && !contains(["root", "admin", "administrator"], var.admin_username)
    error_message = "admin_username must be a Linux user name (lowercase, up to 32 characters) other than root, admin or administrator."
  }
}

variable "admin_ssh_public_key" {
  description = "OpenSSH public key of the admin user (ssh-rsa, ssh-ed25519 or ecdsa-sha2-*). Required when deploy_example_scale_set is true."
  type        = string
  default     = ""

  validation {
    condition     = var.admin_ssh_public_key == "" || can(regex("^(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+( .*)?$", trimspace(var.admin_ssh_public_key)))
    error_message = "admin_ssh_public_key must be one OpenSSH public key line (ssh-rsa, ssh-ed25519 or ecdsa-sha2-nistp*)."
  }
}

variable "example_vnet_cidr" {
  description = "Address space of the example's new virtual network; its first /24 becomes the VMs' subnet."
  type        = string
  default     = "10.42.0.0/16"

  validation {
    condition     = can(cidrsubnet(var.example_vnet_cidr, 24 - tonumber(split("/", var.example_vnet_cidr)[1]), 0))
    error_message = "example_vnet_cidr must be an IPv4 CIDR block of /24 or larger (e.g. 10.42.0.0/16)."
  }
}

variable "agent_package" {
  description = "The agent the example scale set installs (MBRIDGE_PACKAGE): the agent's artifact, <URL of mbridge-agent-servicebus-X.Y.Z.pex>#sha256=<its 64 hex digits> (make agent-artifact writes both), which the installer checks before running anything from it (infra/agent/README.md). Required with deploy_example_scale_set; no default."
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
