output "subscription_name" {
  description = "Name of the VM's commands subscription: MBRIDGE_SERVICEBUS_COMMANDS_SUBSCRIPTION of its agent."
  value       = azurerm_servicebus_subscription.commands.name
}

output "subscription_id" {
  description = "Resource id of the VM's commands subscription, the scope of its receiver role."
  value       = azurerm_servicebus_subscription.commands.id
}
