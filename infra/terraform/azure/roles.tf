# Every role of the deployment, each on the narrowest scope that works: single Service Bus
# entities, single tables, the one Application Insights component. Nothing on the namespace or the
# subscription; the drainer role goes on the drain target only (the load balancer, the NICs'
# resource group, the virtual network), Reader on the resource groups of the VMs only. Built-in roles by name; the principal
# type is given so that a just-created identity is not looked up in Entra ID before it replicated.

locals {
  drain_vnet_resource_group = coalesce(var.drain_virtual_network_resource_group, local.drain_lb_resource_group)

  # The drain target, as ids in this subscription. Built from names rather than looked up, so a
  # target created in the same apply (or not visible to the plan) works too.
  drain_load_balancer_id      = "/subscriptions/${local.subscription_id}/resourceGroups/${local.drain_lb_resource_group}/providers/Microsoft.Network/loadBalancers/${var.drain_load_balancer_name}"
  drain_nic_resource_group_id = "/subscriptions/${local.subscription_id}/resourceGroups/${local.drain_nic_resource_group}"
  drain_virtual_network_id    = "/subscriptions/${local.subscription_id}/resourceGroups/${local.drain_vnet_resource_group}/providers/Microsoft.Network/virtualNetworks/${var.drain_virtual_network_name}"

  # A custom role can only be assigned within its assignable scopes. It is defined in this
  # resource group; when the drain target lives in other resource groups of the subscription,
  # those resource groups (never the subscription) are added, so the assignments below can be made
  # there.
  # The drainer's id in the subscription-level form, as ARM names every role definition
  # (/subscriptions/<id>/providers/Microsoft.Authorization/roleDefinitions/<guid>) and as the Bicep
  # assigns it: written out, so that the form does not hang on what the provider reads back for a
  # role defined at a resource group scope (role_definition_resource_id).
  drainer_role_definition_id = "/subscriptions/${local.subscription_id}/providers/Microsoft.Authorization/roleDefinitions/${azurerm_role_definition.drainer.role_definition_id}"

  drainer_assignable_scopes = distinct(concat(
    [data.azurerm_resource_group.this.id],
    local.drain_enabled ? [
      "/subscriptions/${local.subscription_id}/resourceGroups/${local.drain_lb_resource_group}",
      local.drain_nic_resource_group_id,
      "/subscriptions/${local.subscription_id}/resourceGroups/${local.drain_vnet_resource_group}",
    ] : [],
  ))
}

# ---------------------------------------------------------------- the drainer role

# Only what the load balancer adapter does (docs/azure.md, "A custom role for draining"). Both
# methods read the load balancer (its rules and probes), the backend pools and the NICs, and write
# backend pools: admin-state only sets their entries' state, and an IP-based pool's entries name the
# virtual network (joinLoadBalancer). Pool edits also write NICs, and ARM checks join on the pool, the
# subnet and whatever else the NIC links to: without the NSG, public IP, application security group
# and NAT rule joins, the first drain of a VM whose NIC has them (a portal-made VM's NIC has an NSG of
# its own) fails with LinkedAuthorizationFailed
# (https://learn.microsoft.com/azure/virtual-network/virtual-network-network-interface#permissions).
# The joins take effect where the role is assigned: the NICs' resource group, the load balancer and
# the virtual network.
locals {
  drainer_actions = {
    "admin-state" = [
      "Microsoft.Network/networkInterfaces/read",
      "Microsoft.Network/loadBalancers/read",
      "Microsoft.Network/loadBalancers/backendAddressPools/read",
      "Microsoft.Network/loadBalancers/backendAddressPools/write",
      "Microsoft.Network/virtualNetworks/joinLoadBalancer/action",
    ]
    "pool-edit" = [
      "Microsoft.Network/networkInterfaces/read",
      "Microsoft.Network/loadBalancers/read",
      "Microsoft.Network/loadBalancers/backendAddressPools/read",
      "Microsoft.Network/loadBalancers/backendAddressPools/write",
      "Microsoft.Network/virtualNetworks/joinLoadBalancer/action",
      "Microsoft.Network/networkInterfaces/write",
      "Microsoft.Network/loadBalancers/backendAddressPools/join/action",
      "Microsoft.Network/virtualNetworks/subnets/join/action",
      "Microsoft.Network/networkSecurityGroups/join/action",
      "Microsoft.Network/publicIPAddresses/join/action",
      "Microsoft.Network/applicationSecurityGroups/joinIpConfiguration/action",
      "Microsoft.Network/loadBalancers/inboundNatRules/join/action",
    ]
  }
}

resource "azurerm_role_definition" "drainer" {
  name        = var.drainer_role_name
  scope       = data.azurerm_resource_group.this.id
  description = "Take VMs out of one load balancer's backend pools and put them back: admin state of their pool entries, or their NICs' and IP addresses' memberships (maintenance-bridge)."

  permissions {
    actions     = local.drainer_actions[var.drain_method]
    not_actions = []
  }

  assignable_scopes = local.drainer_assignable_scopes
}

# ---------------------------------------------------------------- the function app

# The topic trigger: receive (and complete) on its own subscription only, as Data Owner rather than
# Data Receiver. The scale controller reads the subscription's message count to scale the app to the
# backlog (target-based scaling), which takes Manage rights; with Listen (Data Receiver) only it falls
# back to incremental scaling, one instance at a time
# (https://learn.microsoft.com/azure/azure-functions/functions-target-based-scaling#service-bus-queues-and-topics;
# the trigger's roles: https://learn.microsoft.com/azure/azure-functions/functions-bindings-service-bus-trigger).
# Scoped to this one subscription, it adds managing that subscription to receiving from it: nothing
# on the topic, the other subscriptions or the namespace (docs/azure.md).
resource "azurerm_role_assignment" "function_receives_events" {
  scope                = azurerm_servicebus_subscription.functions.id
  role_definition_name = "Azure Service Bus Data Owner"
  principal_id         = azurerm_user_assigned_identity.function.principal_id
  principal_type       = "ServicePrincipal"
}

# The command sender: approve / drain / restore onto each commands queue (one per shard) ...
resource "azurerm_role_assignment" "function_sends_commands" {
  count                = local.commands_via_topic ? 0 : var.commands_shards
  scope                = azurerm_servicebus_queue.commands[count.index].id
  role_definition_name = "Azure Service Bus Data Sender"
  principal_id         = azurerm_user_assigned_identity.function.principal_id
  principal_type       = "ServicePrincipal"
}

# ... or, in the isolated mode, onto each commands topic.
resource "azurerm_role_assignment" "function_sends_commands_to_topic" {
  count                = local.commands_via_topic ? var.commands_shards : 0
  scope                = azurerm_servicebus_topic.commands[count.index].id
  role_definition_name = "Azure Service Bus Data Sender"
  principal_id         = azurerm_user_assigned_identity.function.principal_id
  principal_type       = "ServicePrincipal"
}

# State (claims, budgets, drains) and audit, each table on its own.
resource "azurerm_role_assignment" "function_state_table" {
  scope                = azapi_resource.state_table.id
  role_definition_name = "Storage Table Data Contributor"
  principal_id         = azurerm_user_assigned_identity.function.principal_id
  principal_type       = "ServicePrincipal"
}

resource "azurerm_role_assignment" "function_audit_table" {
  scope                = azapi_resource.audit_table.id
  role_definition_name = "Storage Table Data Contributor"
  principal_id         = azurerm_user_assigned_identity.function.principal_id
  principal_type       = "ServicePrincipal"
}

# The Functions host's blob leases and keys (AzureWebJobsStorage__*) and the deployment package.
resource "azurerm_role_assignment" "function_host_storage" {
  scope                = azurerm_storage_account.this.id
  role_definition_name = "Storage Blob Data Owner"
  principal_id         = azurerm_user_assigned_identity.function.principal_id
  principal_type       = "ServicePrincipal"
}

# The command signing key: the function identity reads that one secret (the Key Vault reference
# of MBRIDGE_SIGNING_KEY), nothing else in the vault.
resource "azurerm_role_assignment" "function_reads_signing_key" {
  scope                = azapi_resource.signing_key.id
  role_definition_name = "Key Vault Secrets User"
  principal_id         = azurerm_user_assigned_identity.function.principal_id
  principal_type       = "ServicePrincipal"
}

# Telemetry with an Entra ID token (APPLICATIONINSIGHTS_AUTHENTICATION_STRING). Granted whatever
# var.telemetry says: the Functions host sends its own requests, traces and logs to the component
# with the identity, and with local authentication disabled it has no other way in.
# MBRIDGE_TELEMETRY=azure-monitor adds the functions' spans and metrics on the same grant.
resource "azurerm_role_assignment" "function_publishes_telemetry" {
  scope                = azurerm_application_insights.this.id
  role_definition_name = "Monitoring Metrics Publisher"
  principal_id         = azurerm_user_assigned_identity.function.principal_id
  principal_type       = "ServicePrincipal"
}

# The drainer role, only where a drain writes, and only when a load balancer is given.
resource "azurerm_role_assignment" "function_drains_load_balancer" {
  count              = local.drain_enabled ? 1 : 0
  scope              = local.drain_load_balancer_id
  role_definition_id = local.drainer_role_definition_id
  principal_id       = azurerm_user_assigned_identity.function.principal_id
  principal_type     = "ServicePrincipal"

  lifecycle {
    precondition {
      condition     = var.drain_virtual_network_name != ""
      error_message = "drain_virtual_network_name must be set with drain_load_balancer_name: writing an IP-based pool joins its virtual network and writing a NIC joins its subnet, so the function needs the drainer role on the VMs' virtual network."
    }
  }
}

resource "azurerm_role_assignment" "function_drains_nics" {
  count              = local.drain_enabled ? 1 : 0
  scope              = local.drain_nic_resource_group_id
  role_definition_id = local.drainer_role_definition_id
  principal_id       = azurerm_user_assigned_identity.function.principal_id
  principal_type     = "ServicePrincipal"
}

resource "azurerm_role_assignment" "function_drains_virtual_network" {
  count              = local.drain_enabled ? 1 : 0
  scope              = local.drain_virtual_network_id
  role_definition_id = local.drainer_role_definition_id
  principal_id       = azurerm_user_assigned_identity.function.principal_id
  principal_type     = "ServicePrincipal"
}

# Resolving an agent's attested vmId to its VM's name (functions/azure_app/vm_directory.py) lists
# the VMs and scale set instances of each resource group of MBRIDGE_TRUST_RESOURCE_GROUPS.
# Reader is the narrowest built-in role that reads them and writes nothing (docs/azure.md,
# "Resolving a VM's identity"); it reads every resource of its scope, hence one assignment per
# resource group and never the subscription.
resource "azurerm_role_assignment" "function_reads_vms" {
  for_each             = toset(local.trust_resource_groups)
  scope                = "/subscriptions/${local.subscription_id}/resourceGroups/${each.value}"
  role_definition_name = "Reader"
  principal_id         = azurerm_user_assigned_identity.function.principal_id
  principal_type       = "ServicePrincipal"
}

# ---------------------------------------------------------------- the agents

# Publish event envelopes and command results on the events topic, nothing else.
resource "azurerm_role_assignment" "agent_sends_events" {
  scope                = azurerm_servicebus_topic.events.id
  role_definition_name = "Azure Service Bus Data Sender"
  principal_id         = azurerm_user_assigned_identity.agent.principal_id
  principal_type       = "ServicePrincipal"
}

# Receive commands. Security caveat (docs/security.md#commands-on-azure-who-can-take-them): Service Bus roles cannot be scoped to a
# session, so this lets a VM open ANY VM's session, and a compromised VM could read, take or hold
# another VM's commands. It can never make an agent approve an event that is not its own: every
# agent checks the target and the event's Resources against its own metadata service, and signed
# commands cannot be forged without the functions' key. A lost approval means Azure starts the
# event at its NotBefore. commands_mode = "topic" gives each VM its own subscription instead, and
# then the agents' shared identity gets nothing for commands (modules/vm_commands_subscription).
# The VMs sharing this identity fall in every shard, so it receives on every commands queue: shards
# spread the load and isolate nothing more.
resource "azurerm_role_assignment" "agent_receives_commands" {
  count                = local.commands_via_topic ? 0 : var.commands_shards
  scope                = azurerm_servicebus_queue.commands[count.index].id
  role_definition_name = "Azure Service Bus Data Receiver"
  principal_id         = azurerm_user_assigned_identity.agent.principal_id
  principal_type       = "ServicePrincipal"
}
