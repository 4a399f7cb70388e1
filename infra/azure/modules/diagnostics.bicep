// What the deployment records about itself, and the alert on dead letters:
// - diagnostic settings sending to the deployment's Log Analytics workspace (monitoring.bicep):
//   the signing key's Key Vault (AuditEvent: every read of the signing key, with who read it),
//   the Service Bus namespace (every log category of its tier) and the function app
//   (FunctionAppLogs), each with AllMetrics;
// - a metric alert on the namespace's DeadletteredMessages, split by entity: it fires for every
//   queue or topic whose dead-letter queue holds a message, maintenance-central included.
// Diagnostic settings as the Azure Verified Modules write them (one Microsoft.Insights/
// diagnosticSettings extension resource scoped to the resource, logs by category and metrics as
// AllMetrics, to workspaceId):
// https://github.com/Azure/bicep-registry-modules/blob/main/avm/res/key-vault/vault/main.bicep.
// 2021-05-01-preview, as AVM and azurerm: the type has no stable API version of this shape
// (2016-09-01, the only stable one besides 2015-07-01, is the older per-resource `service`
// setting, with a location and metrics by time grain), and category groups (allLogs, audit) came
// with this one.
// A module of its own, after the resources it watches: modules/servicebus.bicep keeps its
// resource count (main.bicep's commandsShardsPerTemplate).

targetScope = 'resourceGroup'

@description('Name of each diagnostic setting (one per resource).')
param settingName string

@description('Resource id of the Log Analytics workspace the logs and metrics go to.')
param workspaceId string

@description('The signing key\'s Key Vault (this resource group); empty when the key is a secret of a vault of your own (signingKeySecretUri), whose logging is yours.')
param vaultName string

@description('The Service Bus namespace (this resource group).')
param namespaceName string

@description('The function app (this resource group).')
param functionAppName string

@description('Name of the dead-letter alert rule.')
param deadLetterAlertName string

@description('Resource id of an action group the dead-letter alert notifies; empty: the alert fires without notifying anyone.')
param alertActionGroupId string

@description('Tags for every resource.')
param tags object

// With no vault (vaultName empty) its setting is not deployed; the placeholder name keeps the
// scope a well-formed resource id.
resource vault 'Microsoft.KeyVault/vaults@2023-07-01' existing = {
  name: empty(vaultName) ? 'none' : vaultName
}

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: namespaceName
}

resource site 'Microsoft.Web/sites@2024-04-01' existing = {
  name: functionAppName
}

// AuditEvent is every request to the vault: each read of the signing key (SecretGet, the platform
// resolving the app's Key Vault reference with the function identity), each new version, each
// refused request, with the caller's object id and address
// (https://learn.microsoft.com/azure/key-vault/general/logging). It is what the `audit` category
// group holds; the vault's other category, AzurePolicyEvaluationDetails, is left out.
resource vaultDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(vaultName)) {
  name: settingName
  scope: vault
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        category: 'AuditEvent'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

// allLogs: every log category the namespace's tier writes. OperationalLogs (every management
// operation on the namespace and its entities: who created, changed or deleted a queue, a topic, a
// subscription or a rule) and VNetAndIPFilteringLogs (empty here: the namespace has no network
// rules) on every tier; on Premium also RuntimeAuditLogs (each data-plane operation, send,
// receive, ..., aggregated per minute with the caller's identity), ApplicationMetricsLogs and
// DiagnosticErrorLogs (https://learn.microsoft.com/azure/service-bus-messaging/monitor-service-bus-reference).
// The group follows the tier, so one setting fits Standard and Premium. AllMetrics copies the
// namespace's metrics (message counts, dead letters, throttled requests) into AzureMetrics.
resource namespaceDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: namespace
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

// FunctionAppLogs: what the Functions host and the functions log, also on the Flex Consumption
// plan, which sends every level to it whatever host.json filters
// (https://github.com/Azure/azure-functions-host/issues/11434); Application Insights keeps the
// same traces with their operation ids.
resource siteDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: site
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        category: 'FunctionAppLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

// DeadletteredMessages is the count of messages in an entity's dead-letter queue, by EntityName
// (a queue, or a topic with the dead letters of all its subscriptions)
// (https://learn.microsoft.com/azure/service-bus-messaging/monitor-service-bus-reference#metrics).
// The dimension value '*' makes one time series, and one alert, per entity, including entities
// created later (https://learn.microsoft.com/azure/azure-monitor/alerts/alerts-metric-multiple-time-series-single-rule):
// maintenance-events (the functions' and operator-results' dead letters), every commands entity
// and maintenance-central, each under its own name. The count is a gauge: the alert stays fired
// until the dead letters are read or deleted, and resolves by itself then.
// Without an action group the alert still fires and is listed in Azure Monitor (Alerts, and
// Azure Resource Graph's alertsmanagementresources): nobody is paged, as the deployment knows no
// receiver. Give alertActionGroupId, or route it with an alert processing rule.
resource deadLetterAlert 'Microsoft.Insights/metricAlerts@2026-01-01' = {
  name: deadLetterAlertName
  location: 'global'
  tags: tags
  properties: {
    description: 'A dead-letter queue of the maintenance-bridge Service Bus namespace holds a message (one alert per queue or topic, EntityName): what to do is in docs/azure.md, "Logs, audit and alerts".'
    severity: 2
    enabled: true
    scopes: [
      namespace.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'DeadLetteredMessages'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: empty(alertActionGroupId) ? [] : [
      {
        actionGroupId: alertActionGroupId
      }
    ]
  }
}

output deadLetterAlertId string = deadLetterAlert.id
