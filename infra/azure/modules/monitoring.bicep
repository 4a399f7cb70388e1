// Logs and telemetry of the function app: a Log Analytics workspace and a workspace-based
// Application Insights component that accepts Entra ID-authenticated ingestion only.

targetScope = 'resourceGroup'

@description('Log Analytics workspace name.')
param workspaceName string

@description('Application Insights component name.')
param appInsightsName string

@description('Azure region.')
param location string

@description('Tags for every resource.')
param tags object

@description('Days the workspace keeps logs.')
@minValue(30)
@maxValue(730)
param retentionInDays int

@description('Principal (object) id of the function app\'s identity.')
param functionPrincipalId string

// Built-in role definition (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles)
var monitoringMetricsPublisherRoleId = '3913510d-42f4-4e42-8a64-420c390055eb'

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: workspaceName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
    features: {
      disableLocalAuth: true // no workspace keys: Entra ID only
    }
  }
}

// 2020-02-02 is the newest non-preview API version of Microsoft.Insights/components.
resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: appInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
    DisableLocalAuth: true // the instrumentation key alone cannot ingest: Entra ID tokens only
    publicNetworkAccessForIngestion: 'Enabled'
    publicNetworkAccessForQuery: 'Enabled'
  }
}

// Entra ID ingestion (APPLICATIONINSIGHTS_AUTHENTICATION_STRING) needs this role on the component.
// Granted whatever the parameter telemetry says: the Functions host sends its own requests, traces
// and logs to the component with the identity, and with local auth disabled it has no other way
// in. MBRIDGE_TELEMETRY=azure-monitor adds the functions' spans and metrics on the same grant.
resource functionPublishesTelemetry 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, functionPrincipalId, monitoringMetricsPublisherRoleId)
  scope: appInsights
  properties: {
    principalId: functionPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisherRoleId)
    principalType: 'ServicePrincipal'
  }
}

output appInsightsName string = appInsights.name
output workspaceId string = workspace.id
