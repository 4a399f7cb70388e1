# Service Bus: the events topic (agents → function), the operators' results subscription, and the
# session-enabled commands queue (function, operators → one agent), or with commands_mode = "topic"
# the commands topic and one filtered subscription per VM (modules/vm_commands_subscription); with
# commands_shards > 1, that many queues or topics (commands_shards.tf).
# docs/transports.md describes how the agents and the functions use each entity.

resource "azurerm_servicebus_namespace" "this" {
  #checkov:skip=CKV_AZURE_201:Microsoft-managed keys encrypt the namespace; customer-managed keys need the Premium tier and a Key Vault, which this deployment does not create
  #checkov:skip=CKV_AZURE_204:The agents and the Flex Consumption app reach Service Bus over its public endpoint (no private endpoints here); every client needs an Entra ID token and a role on one entity
  #checkov:skip=CKV_AZURE_199:Double encryption is a Premium-only customer-managed-key option
  #checkov:skip=CKV_AZURE_202:The namespace calls nothing on its own (no customer-managed key, no forwarding elsewhere), so it needs no identity; its clients use theirs
  name                = local.namespace_name
  resource_group_name = data.azurerm_resource_group.this.name
  location            = local.location
  sku                 = var.servicebus_sku
  # Premium is sold in messaging units (capacity) and needs at least one partition; Standard takes 0.
  capacity                     = var.servicebus_sku == "Premium" ? 1 : 0
  premium_messaging_partitions = var.servicebus_sku == "Premium" ? 1 : 0

  # Entra ID only: no SAS key or connection string can authenticate against this namespace.
  local_auth_enabled  = false
  minimum_tls_version = "1.2"

  tags = var.tags

  # The namespace's quotas against the fleet (commands_shards.tf).
  lifecycle {
    precondition {
      condition     = alltrue([for check in values(local.commands_quota_checks) : check.ok])
      error_message = join(" ", [for check in values(local.commands_quota_checks) : check.message if !check.ok])
    }
  }
}

# Every event envelope (and every command result). MessageId = SHA-256 of the body as sent (command
# results: their envelope id), so duplicate detection drops an identical resend; the functions'
# claim makes any other republish a no-op (docs/contracts.md#on-the-bus).
resource "azurerm_servicebus_topic" "events" {
  name                                    = "maintenance-events"
  namespace_id                            = azurerm_servicebus_namespace.this.id
  requires_duplicate_detection            = true
  duplicate_detection_history_time_window = var.events_duplicate_detection_window
  default_message_ttl                     = "P14D"
  # Keeps the topic's messages in the order they were sent. That is no delivery order: the functions'
  # subscription has no sessions, so parallel invocations, retries and a dead-lettered message
  # resubmitted later can hand a `scheduled` over after its `completed`. The functions rely on no
  # order: a step of an event that has ended is only audited as late (functions/core/lifecycle.py,
  # docs/azure.md "How a message is handled").
  support_ordering = true
}

# The function app's subscription. The host renews the 5-minute lock for up to 10 minutes
# (host.json); after 10 failed invocations a message goes to the dead-letter queue, where it
# waits to be resubmitted once the cause (a missing role, table or load balancer) is fixed.
resource "azurerm_servicebus_subscription" "functions" {
  name                                      = var.function_subscription_name
  topic_id                                  = azurerm_servicebus_topic.events.id
  max_delivery_count                        = 10
  lock_duration                             = "PT5M"
  dead_lettering_on_message_expiration      = true
  dead_lettering_on_filter_evaluation_error = true
}

# `mbridge approve` waits here for the result of the command it sent.
resource "azurerm_servicebus_subscription" "operator_results" {
  name               = "operator-results"
  topic_id           = azurerm_servicebus_topic.events.id
  max_delivery_count = 10
  # A result nobody waited for within the hour is of no use to anyone.
  default_message_ttl                       = "PT1H"
  dead_lettering_on_message_expiration      = false
  dead_lettering_on_filter_evaluation_error = true
}

# Keeps maintenance events out of operator-results: only command results pass.
resource "azurerm_servicebus_subscription_rule" "command_results" {
  name            = "command-results"
  subscription_id = azurerm_servicebus_subscription.operator_results.id
  filter_type     = "SqlFilter"
  sql_filter      = "type LIKE 'org.maintenancebridge.command.%'"
}

# Service Bus gives every new subscription a rule `$Default` with a TrueFilter, and a message is
# delivered when ANY rule matches: next to it, the SQL rule above would filter nothing. azurerm
# adds rules but cannot remove that one, so it is deleted through Azure Resource Manager once the
# SQL rule exists (never leaving the subscription with no rule at all). It runs again whenever
# the subscription changes: a replaced subscription (same id) comes with a new `$Default`, and
# for an updated one the delete finds nothing (Rules_Delete then answers 204 No Content).
resource "azapi_resource_action" "remove_operator_results_default_rule" {
  type        = "Microsoft.ServiceBus/namespaces/topics/subscriptions/rules@2021-11-01"
  resource_id = "${azurerm_servicebus_subscription.operator_results.id}/rules/$Default"
  method      = "DELETE"

  depends_on = [azurerm_servicebus_subscription_rule.command_results]

  lifecycle {
    replace_triggered_by = [azurerm_servicebus_subscription.operator_results]
  }
}

# One session per VM (SessionId = VM name): each agent receives only its own commands, in order.
# One queue per shard, all alike.
resource "azurerm_servicebus_queue" "commands" {
  count        = local.commands_via_topic ? 0 : var.commands_shards
  name         = local.commands_entity_names[count.index]
  namespace_id = azurerm_servicebus_namespace.this.id

  requires_session = true
  # The agent renews its session lock before each wait; a minute leaves room for that.
  lock_duration = "PT1M"
  # A command's default lifetime (expires_at = issued_at + 10 minutes, docs/contracts.md#command-fields).
  default_message_ttl = "PT10M"
  # MessageId = command_id: a command sent twice is delivered once.
  requires_duplicate_detection            = true
  duplicate_detection_history_time_window = "PT10M"
  max_delivery_count                      = 10
  # An expired command is useless (the agent would reject it as expired, and its event has moved
  # on), so it is dropped rather than dead-lettered for someone to resubmit.
  dead_lettering_on_message_expiration = false
}

# The isolated mode: commands carry the application property `target`, and each VM's subscription
# (below) passes only its own. Same names as the queues: a deployment has one or the other. One
# topic per shard, all alike.
resource "azurerm_servicebus_topic" "commands" {
  count        = local.commands_via_topic ? var.commands_shards : 0
  name         = local.commands_entity_names[count.index]
  namespace_id = azurerm_servicebus_namespace.this.id

  # MessageId = command_id: a command sent twice is delivered once.
  requires_duplicate_detection            = true
  duplicate_detection_history_time_window = "PT10M"
  # A command's default lifetime (expires_at = issued_at + 10 minutes, docs/contracts.md#command-fields).
  default_message_ttl = "PT10M"
  # One VM's commands in the order they were sent.
  support_ordering = true
}

# One subscription per VM, filtered on its name, on the topic of the VM's shard, with the receiver
# role for that VM's own identity only. VMs deployed elsewhere call the module themselves
# (docs/deploy.md).
module "vm_commands_subscription" {
  source   = "./modules/vm_commands_subscription"
  for_each = local.commands_via_topic ? var.commands_subscription_vms : {}

  topic_id        = azurerm_servicebus_topic.commands[local.commands_subscription_shards[each.key]].id
  events_topic_id = azurerm_servicebus_topic.events.id
  vm_name         = each.key
  principal_id    = each.value
}
