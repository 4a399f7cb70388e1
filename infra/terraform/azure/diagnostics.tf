# What the deployment records about itself, and the alert on dead letters (the same as the
# Bicep's modules/diagnostics.bicep):
# - diagnostic settings sending to the deployment's Log Analytics workspace (main.tf): the signing
#   key's Key Vault (AuditEvent: every read of the signing key, with who read it), the Service Bus
#   namespace (every log category of its tier) and the function app (FunctionAppLogs), each with
#   AllMetrics;
# - a metric alert on the namespace's DeadletteredMessages, split by entity: it fires for every
#   queue or topic whose dead-letter queue holds a message, maintenance-central included.
# Diagnostic settings as the Azure Verified Modules write them (logs by category, metrics as
# AllMetrics, to the workspace):
# https://github.com/Azure/terraform-azurerm-avm-res-keyvault-vault (diagnostic_settings).

# AuditEvent is every request to the vault: each read of the signing key (SecretGet, the platform
# resolving the app's Key Vault reference with the function identity), each new version, each
# refused request, with the caller's object id and address
# (https://learn.microsoft.com/azure/key-vault/general/logging). It is what the `audit` category
# group holds; the vault's other category, AzurePolicyEvaluationDetails, is left out.
resource "azurerm_monitor_diagnostic_setting" "signing_vault" {
  name                       = "${var.name_prefix}-logs"
  target_resource_id         = azurerm_key_vault.signing.id
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  enabled_log {
    category = "AuditEvent"
  }
  enabled_metric {
    category = "AllMetrics"
  }
}

# allLogs: every log category the namespace's tier writes. OperationalLogs (every management
# operation on the namespace and its entities: who created, changed or deleted a queue, a topic, a
# subscription or a rule) and VNetAndIPFilteringLogs (empty here: the namespace has no network
# rules) on every tier; on Premium also RuntimeAuditLogs (each data-plane operation, send,
# receive, ..., aggregated per minute with the caller's identity), ApplicationMetricsLogs and
# DiagnosticErrorLogs (https://learn.microsoft.com/azure/service-bus-messaging/monitor-service-bus-reference).
# The group follows the tier, so one setting fits Standard and Premium. AllMetrics copies the
# namespace's metrics (message counts, dead letters, throttled requests) into AzureMetrics.
resource "azurerm_monitor_diagnostic_setting" "servicebus" {
  name                       = "${var.name_prefix}-logs"
  target_resource_id         = azurerm_servicebus_namespace.this.id
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  enabled_log {
    category_group = "allLogs"
  }
  enabled_metric {
    category = "AllMetrics"
  }
}

# FunctionAppLogs: what the Functions host and the functions log, also on the Flex Consumption
# plan, which sends every level to it whatever host.json filters
# (https://github.com/Azure/azure-functions-host/issues/11434); Application Insights keeps the
# same traces with their operation ids.
resource "azurerm_monitor_diagnostic_setting" "function_app" {
  name                       = "${var.name_prefix}-logs"
  target_resource_id         = azurerm_function_app_flex_consumption.this.id
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  enabled_log {
    category = "FunctionAppLogs"
  }
  enabled_metric {
    category = "AllMetrics"
  }
}

# DeadletteredMessages is the count of messages in an entity's dead-letter queue, by EntityName (a
# queue, or a topic with the dead letters of all its subscriptions)
# (https://learn.microsoft.com/azure/service-bus-messaging/monitor-service-bus-reference#metrics).
# The dimension value "*" makes one time series, and one alert, per entity, including entities
# created later (https://learn.microsoft.com/azure/azure-monitor/alerts/alerts-metric-multiple-time-series-single-rule):
# maintenance-events (the functions' and operator-results' dead letters), every commands entity
# and maintenance-central, each under its own name. The count is a gauge: the alert stays fired
# until the dead letters are read or deleted, and resolves by itself then.
# Without an action group the alert still fires and is listed in Azure Monitor (Alerts, and Azure
# Resource Graph's alertsmanagementresources): nobody is paged, as the deployment knows no
# receiver. Give alert_action_group_id, or route it with an alert processing rule.
resource "azurerm_monitor_metric_alert" "dead_letters" {
  name                = "${var.name_prefix}-dead-letters-${local.suffix}"
  resource_group_name = data.azurerm_resource_group.this.name
  scopes              = [azurerm_servicebus_namespace.this.id]
  description         = "A dead-letter queue of the maintenance-bridge Service Bus namespace holds a message (one alert per queue or topic, EntityName): what to do is in docs/azure.md, \"Logs, audit and alerts\"."
  severity            = 2
  enabled             = true
  frequency           = "PT5M"
  window_size         = "PT5M"
  auto_mitigate       = true

  criteria {
    metric_namespace = "Microsoft.ServiceBus/namespaces"
    metric_name      = "DeadletteredMessages"
    aggregation      = "Maximum"
    operator         = "GreaterThan"
    threshold        = 0

    dimension {
      name     = "EntityName"
      operator = "Include"
      values   = ["*"]
    }
  }

  dynamic "action" {
    for_each = var.alert_action_group_id == "" ? [] : [var.alert_action_group_id]
    content {
      action_group_id = action.value
    }
  }

  tags = var.tags
}
