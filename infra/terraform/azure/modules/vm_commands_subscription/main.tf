# One VM's commands in the isolated mode (commands_mode = "topic", docs/azure.md): a subscription of
# the commands topic that passes only the messages whose application property `target` is this VM,
# and the Azure Service Bus Data Receiver role on that subscription alone for this VM's own managed
# identity (user- or system-assigned). Unlike a session of the shared queue, no other VM can read,
# take or hold up these commands: roles can be scoped to a subscription, not to a session.
#
# The agent authenticates with that one identity for everything, so it also gets Data Sender on the
# events topic (events_topic_id; null: granted elsewhere).
#
# Isolation needs an identity per VM: the VMs of a scale set share the scale set's identity, so
# they stay on the queue mode. Call the module once per VM; the agent on the VM then sets
# MBRIDGE_SERVICEBUS_COMMANDS_SUBSCRIPTION to the output subscription_name.

resource "azurerm_servicebus_subscription" "commands" {
  name     = "vm-${var.vm_name}"
  topic_id = var.topic_id

  # One reader, this VM's agent; its ledger keeps execute_at and command ids (docs/transports.md).
  requires_session = false
  # The agent completes a command once it recorded what it did, renewing the lock if it runs short.
  lock_duration = var.lock_duration
  # A command's default lifetime (expires_at = issued_at + 10 minutes, docs/contracts.md#command-fields).
  default_message_ttl = "PT10M"
  max_delivery_count  = var.max_delivery_count
  # An expired command is useless (the agent would reject it): dropped, not dead-lettered.
  dead_lettering_on_message_expiration      = false
  dead_lettering_on_filter_evaluation_error = true
}

# Only this VM's commands. A correlation filter compares the property exactly: no SQL text is built
# from the VM's name.
resource "azurerm_servicebus_subscription_rule" "only_this_vm" {
  name            = "only-this-vm"
  subscription_id = azurerm_servicebus_subscription.commands.id
  filter_type     = "CorrelationFilter"

  correlation_filter {
    properties = {
      target = var.vm_name
    }
  }
}

# A new subscription also gets the rule `$Default` (a TrueFilter), and a message is delivered when
# ANY rule matches: next to it the filter above would pass every VM's commands. azurerm cannot
# remove it, so it is deleted through Azure Resource Manager once the filter exists, and again for
# a replaced subscription (same id, new `$Default`); see servicebus.tf for operator-results.
resource "azapi_resource_action" "remove_default_rule" {
  type        = "Microsoft.ServiceBus/namespaces/topics/subscriptions/rules@2021-11-01"
  resource_id = "${azurerm_servicebus_subscription.commands.id}/rules/$Default"
  method      = "DELETE"

  depends_on = [azurerm_servicebus_subscription_rule.only_this_vm]

  lifecycle {
    replace_triggered_by = [azurerm_servicebus_subscription.commands]
  }
}

# Receive (and complete) on this subscription only: nothing on the topic or the namespace. Granted
# once `$Default` is gone: what it let in before is other VMs' commands.
resource "azurerm_role_assignment" "vm_receives_its_commands" {
  scope                = azurerm_servicebus_subscription.commands.id
  role_definition_name = "Azure Service Bus Data Receiver"
  principal_id         = var.principal_id
  # A managed identity: no lookup in Entra ID of an identity that may not have replicated yet.
  principal_type = "ServicePrincipal"

  depends_on = [azapi_resource_action.remove_default_rule]
}

# The agent publishes its events (and command results) with the same identity: the events topic only.
resource "azurerm_role_assignment" "vm_sends_events" {
  count                = var.events_topic_id == null ? 0 : 1
  scope                = var.events_topic_id
  role_definition_name = "Azure Service Bus Data Sender"
  principal_id         = var.principal_id
  principal_type       = "ServicePrincipal"
}
