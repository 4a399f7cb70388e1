# What the agents (outside the example too), `mbridge approve` and a package upload need.

output "resource_group_name" {
  description = "Resource group holding the deployment."
  value       = data.azurerm_resource_group.this.name
}

output "servicebus_namespace_fqdn" {
  description = "Service Bus namespace host name: the agents' --servicebus-namespace (MBRIDGE_SERVICEBUS_NAMESPACE)."
  value       = local.servicebus_fqdn
}

output "events_topic" {
  description = "Topic the agents publish events and command results to."
  value       = azurerm_servicebus_topic.events.name
}

output "function_subscription" {
  description = "The events topic's subscription that the function app consumes."
  value       = azurerm_servicebus_subscription.functions.name
}

output "operator_results_subscription" {
  description = "The events topic's subscription `mbridge approve` reads command results from (grant operators Azure Service Bus Data Receiver on it)."
  value       = azurerm_servicebus_subscription.operator_results.name
}

output "commands_queue" {
  description = "Session-enabled queue of commands to the agents (session = VM name), shard 0's with commands_shards > 1 (commands_entities); empty in topic mode."
  value       = local.commands_via_topic ? "" : azurerm_servicebus_queue.commands[0].name
}

output "commands_topic" {
  description = "Topic of commands to the agents in topic mode (commands_mode), shard 0's with commands_shards > 1 (commands_entities); empty in queue mode."
  value       = local.commands_via_topic ? azurerm_servicebus_topic.commands[0].name : ""
}

output "commands_entities" {
  description = "Every commands entity (queues, or topics in topic mode), shard 0 first: a VM's is `mbridge commands-entity --vm NAME --shards <commands_shards>`."
  value       = local.commands_via_topic ? azurerm_servicebus_topic.commands[*].name : azurerm_servicebus_queue.commands[*].name
}

output "commands_subscription_topics" {
  description = "Topic mode: each VM of commands_subscription_vms => the commands topic of its shard, which holds its subscription."
  value       = { for name, shard in local.commands_subscription_shards : name => local.commands_entity_names[shard] if local.commands_via_topic }
}

output "commands_subscriptions" {
  description = "Topic mode: each VM of commands_subscription_vms => its subscription, the agent's MBRIDGE_SERVICEBUS_COMMANDS_SUBSCRIPTION."
  value       = { for name, subscription in module.vm_commands_subscription : name => subscription.subscription_name }
}

output "function_app_name" {
  description = "Name of the function app, for `func azure functionapp publish`."
  value       = azurerm_function_app_flex_consumption.this.name
}

output "key_vault_references_check_command" {
  description = "Run from the repository root after the apply: reads the status of the app's Key Vault references (the signing key) and restarts the app until they resolve (docs/deploy.md, \"After the deployment: Key Vault references\")."
  value       = "python3 scripts/check_keyvault_references.py --subscription ${local.subscription_id} --resource-group ${data.azurerm_resource_group.this.name} --name ${azurerm_function_app_flex_consumption.this.name} --restart"
}

output "function_identity_principal_id" {
  description = "Principal (object) id of the function app's user-assigned identity, to grant it roles elsewhere."
  value       = azurerm_user_assigned_identity.function.principal_id
}

output "function_identity_client_id" {
  description = "Client id of the function app's user-assigned identity."
  value       = azurerm_user_assigned_identity.function.client_id
}

output "agent_identity_id" {
  description = "Resource id of the agents' user-assigned identity: attach it to other VMs or scale sets that run the agent."
  value       = azurerm_user_assigned_identity.agent.id
}

output "agent_identity_client_id" {
  description = "Client id of the agents' identity: the agents' AZURE_CLIENT_ID."
  value       = azurerm_user_assigned_identity.agent.client_id
}

output "agent_verify_key" {
  description = "MBRIDGE_VERIFY_KEY of every agent: the public key of the generated command signing key, as one line (raw base64)."
  value       = local.verify_key
}

output "agent_environment_file" {
  description = "The agent's environment file (KEY=value lines) as the example VMs get it, for VMs outside the example that carry the agents' identity."
  value       = local.agent_environment_file
}

output "storage_account_name" {
  description = "Storage account of the tables, the Functions host and the deployment package."
  value       = azurerm_storage_account.this.name
}

output "table_endpoint" {
  description = "Table service URL (MBRIDGE_TABLE_ENDPOINT), e.g. for `mbridge audit` or `az storage entity query --auth-mode login`."
  value       = azurerm_storage_account.this.primary_table_endpoint
}

output "state_table" {
  description = "Table of idempotency claims, budget reservations and drains."
  value       = azapi_resource.state_table.name
}

output "audit_table" {
  description = "Append-only audit table (partition = VM name)."
  value       = azapi_resource.audit_table.name
}

output "deployment_container_url" {
  description = "Blob container the Flex Consumption app runs its package from."
  value       = azurerm_function_app_flex_consumption.this.storage_container_endpoint
}

output "drainer_role_definition_id" {
  description = "Resource id of the custom drainer role."
  value       = local.drainer_role_definition_id
}

output "example_load_balancer_private_ip" {
  description = "Frontend address of the example's internal load balancer; null without the example."
  value       = var.deploy_example_scale_set ? azurerm_lb.agents[0].frontend_ip_configuration[0].private_ip_address : null
}

output "example_scale_set_name" {
  description = "Name of the example scale set; null without the example."
  value       = var.deploy_example_scale_set ? azurerm_linux_virtual_machine_scale_set.agents[0].name : null
}

output "central_queue" {
  description = "The queue of the control plane's reports, MBRIDGE_CENTRAL_QUEUE (empty with central_reports = false)."
  value       = var.central_reports ? azurerm_servicebus_queue.central[0].name : ""
}

output "central_system_topic_name" {
  description = "The Event Grid system topic of the subscription's Scheduled Events (empty with central_reports = false)."
  value       = var.central_reports ? azurerm_eventgrid_system_topic.maintenance[0].name : ""
}
