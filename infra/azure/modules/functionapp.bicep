// The Azure Functions app (docs/azure.md) on the Flex Consumption plan: Python 3.11 on Linux,
// one user-assigned identity for everything (host storage, deployment package, Service Bus,
// tables, load balancer, telemetry), and app settings without a single key to an Azure resource.
// The one secret among them is the command signing key, from a secure parameter or a Key Vault
// reference.

targetScope = 'resourceGroup'

@description('Function app name (globally unique: <name>.azurewebsites.net).')
param appName string

@description('Flex Consumption plan name.')
param planName string

@description('Azure region.')
param location string

@description('Tags for every resource.')
param tags object

@description('Resource id of the function app\'s user-assigned identity.')
param identityId string

@description('Client id of the function app\'s user-assigned identity.')
param identityClientId string

@description('Name of the storage account of the host, the deployment package and the tables.')
param storageAccountName string

@description('Blob container of the deployment package.')
param deploymentContainerName string

@description('Application Insights component name.')
param appInsightsName string

@description('FQDN of the Service Bus namespace.')
param serviceBusNamespaceFqdn string

@description('The events topic.')
param eventsTopicName string

@description('The topic subscription this app consumes.')
param eventsSubscriptionName string

@description('The session-enabled commands queue (empty in the topic mode).')
param commandsQueueName string

@description('queue: commands go into the target VM\'s session of the queue; topic: onto the commands topic, with the application property `target` the VMs\' subscriptions filter on.')
@allowed([
  'queue'
  'topic'
])
param commandsMode string

@description('The commands topic (empty in the queue mode).')
param commandsTopicName string

@description('How many commands entities the commands are spread over (MBRIDGE_COMMANDS_SHARDS).')
@minValue(1)
@maxValue(1024)
param commandsShards int

@description('The state table.')
param stateTableName string

@description('The audit table.')
param auditTableName string

@description('Subscription id of the load balancer to drain VMs from; empty when VMs drain through /readyz only.')
param loadBalancerSubscriptionId string

@description('Resource group of that load balancer; empty when none.')
param loadBalancerResourceGroup string

@description('Name of that load balancer; empty when none.')
param loadBalancerName string

@description('Resource group of the VMs\' NICs; empty when none.')
param loadBalancerNicResourceGroup string

@description('MBRIDGE_LB_DRAIN: admin-state or pool-edit.')
@allowed([
  'admin-state'
  'pool-edit'
])
param loadBalancerDrainMethod string

@description('MBRIDGE_READINESS_DRAIN: also drain through the agents\' /readyz (drain/restore commands), for health-probe based load balancing.')
param readinessDrain bool

@description('MBRIDGE_TELEMETRY: off, or azure-monitor for a span and metrics of each invocation in Application Insights (docs/operations.md#telemetry).')
@allowed([
  'off'
  'azure-monitor'
])
param telemetry string

@description('The policy as JSON or YAML (docs/policy.md); empty for the default policy.')
param policy string

@secure()
@description('MBRIDGE_WEBHOOK_URL: where notices of decisions and actions are posted (docs/operations.md#notifications); empty for none. An https URL or a Key Vault reference.')
param webhookUrl string

@description('MBRIDGE_WEBHOOK_TEMPLATE: the JSON body of each notice; empty for the default.')
param webhookTemplate string

@description('MBRIDGE_WEBHOOK_ACTIONS: which audit records are posted; empty for the default.')
param webhookActions string

@secure()
@minLength(1)
@description('MBRIDGE_SIGNING_KEY: the Ed25519 private key that signs commands, or a Key Vault reference to it (@Microsoft.KeyVault(SecretUri=...)). Required: the agents run signed commands only.')
param signingKey string

@description('MBRIDGE_TRUST_RESOURCE_GROUPS: comma-separated resource groups where the VMs of attested documents are looked up (the identity holds Reader on each).')
param trustResourceGroups string

@description('MBRIDGE_TRUST_SUBSCRIPTIONS: comma-separated subscription ids whose VMs may report.')
@minLength(36)
param trustSubscriptions string

@description('MBRIDGE_CENTRAL_QUEUE: the Service Bus queue of the control plane\'s reports (modules/central-reports.bicep); empty: the app registers no central function.')
param centralQueueName string

@description('MBRIDGE_CENTRAL_RECONCILE: read the trusted subscriptions\' Scheduled Events from Azure Resource Graph on a timer (with the Reader role on the VMs\' resource groups).')
param centralReconcile bool

@description('Upper bound of the instances the app scales out to (Flex Consumption takes 40 to 1000).')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int

@description('Memory of each instance.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int

resource storageAccount 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

var appSettings = [
  // The host's own storage, through the identity (no AzureWebJobsStorage connection string).
  { name: 'AzureWebJobsStorage__accountName', value: storageAccount.name }
  { name: 'AzureWebJobsStorage__credential', value: 'managedidentity' }
  { name: 'AzureWebJobsStorage__clientId', value: identityClientId }
  // Telemetry with Entra ID ingestion (the component refuses the instrumentation key alone).
  { name: 'APPLICATIONINSIGHTS_CONNECTION_STRING', value: appInsights.properties.ConnectionString }
  { name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING', value: 'Authorization=AAD;ClientId=${identityClientId}' }
  // DefaultAzureCredential of our adapters (tables, load balancer, command sender).
  { name: 'AZURE_CLIENT_ID', value: identityClientId }
  { name: 'MBRIDGE_EVENTS_TOPIC', value: eventsTopicName }
  { name: 'MBRIDGE_EVENTS_SUBSCRIPTION', value: eventsSubscriptionName }
  { name: 'MBRIDGE_COMMANDS_QUEUE', value: commandsQueueName }
  { name: 'MBRIDGE_COMMANDS_MODE', value: commandsMode }
  { name: 'MBRIDGE_COMMANDS_TOPIC', value: commandsTopicName }
  { name: 'MBRIDGE_COMMANDS_SHARDS', value: string(commandsShards) }
  // The trigger's identity-based connection `MBRIDGE_SERVICEBUS` (no SAS connection string).
  { name: 'MBRIDGE_SERVICEBUS__fullyQualifiedNamespace', value: serviceBusNamespaceFqdn }
  { name: 'MBRIDGE_SERVICEBUS__credential', value: 'managedidentity' }
  { name: 'MBRIDGE_SERVICEBUS__clientId', value: identityClientId }
  { name: 'MBRIDGE_TABLE_ENDPOINT', value: storageAccount.properties.primaryEndpoints.table }
  { name: 'MBRIDGE_STATE_TABLE', value: stateTableName }
  { name: 'MBRIDGE_AUDIT_TABLE', value: auditTableName }
  // All four empty: the function drains through the agents' /readyz only.
  { name: 'MBRIDGE_LB_SUBSCRIPTION_ID', value: loadBalancerSubscriptionId }
  { name: 'MBRIDGE_LB_RESOURCE_GROUP', value: loadBalancerResourceGroup }
  { name: 'MBRIDGE_LB_NAME', value: loadBalancerName }
  { name: 'MBRIDGE_LB_NIC_RESOURCE_GROUP', value: loadBalancerNicResourceGroup }
  { name: 'MBRIDGE_LB_DRAIN', value: loadBalancerDrainMethod }
  { name: 'MBRIDGE_READINESS_DRAIN', value: readinessDrain ? 'true' : 'false' }
  { name: 'MBRIDGE_POLICY', value: policy }
  // The functions' own spans and metrics, to the Application Insights above with the identity
  // (docs/operations.md#telemetry); off: nothing of OpenTelemetry is loaded.
  { name: 'MBRIDGE_TELEMETRY', value: telemetry }
  // Notices of decisions and actions; empty: none.
  { name: 'MBRIDGE_WEBHOOK_URL', value: webhookUrl }
  { name: 'MBRIDGE_WEBHOOK_TEMPLATE', value: webhookTemplate }
  { name: 'MBRIDGE_WEBHOOK_ACTIONS', value: webhookActions }
  // Every command is signed with it; the agents verify with its public key. A Key Vault
  // reference is resolved by the platform with keyVaultReferenceIdentity (the identity needs
  // "Key Vault Secrets User" on that secret, granted where the vault lives).
  { name: 'MBRIDGE_SIGNING_KEY', value: signingKey }
  // Who may report (policy trust: attested, the default): attested documents of VMs of these
  // subscriptions, resolved to VM names in these resource groups. The roots, intermediates and
  // signer names keep the code's defaults (docs/azure.md, "Trust"); MBRIDGE_TRUST_FILE is for
  // local runs only and never deployed.
  { name: 'MBRIDGE_TRUST_SUBSCRIPTIONS', value: trustSubscriptions }
  { name: 'MBRIDGE_TRUST_RESOURCE_GROUPS', value: trustResourceGroups }
  // The control plane's reports (docs/azure.md, "The control plane's reports"): the queue the Event
  // Grid subscription delivers into (empty: none), and Resource Graph read on a timer. Both need
  // MBRIDGE_TRUST_SUBSCRIPTIONS, set above.
  { name: 'MBRIDGE_CENTRAL_QUEUE', value: centralQueueName }
  { name: 'MBRIDGE_CENTRAL_RECONCILE', value: centralReconcile ? 'true' : 'false' }
]

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  // checkov:skip=CKV_AZURE_225:Flex Consumption zone redundancy exists in some regions only and would make the template fail elsewhere; set properties.zoneRedundant where the region supports it.
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true // Linux
  }
}

resource site 'Microsoft.Web/sites@2024-04-01' = {
  // checkov:skip=CKV_AZURE_17:No HTTP trigger: the app is triggered by Service Bus only, and inbound HTTP is denied (ipSecurityRestrictionsDefaultAction).
  // checkov:skip=CKV_AZURE_222:The public endpoint stays on for deployments (scm); the app itself denies all inbound HTTP.
  // checkov:skip=CKV_AZURE_213:No HTTP endpoint to probe: the app is triggered by Service Bus only.
  // checkov:skip=CKV_AZURE_212:numberOfWorkers does not apply to Flex Consumption: instances scale out per Service Bus load up to maximumInstanceCount.
  name: appName
  location: location
  tags: tags
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    keyVaultReferenceIdentity: identityId
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storageAccount.properties.primaryEndpoints.blob}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
    siteConfig: {
      minTlsVersion: '1.2'
      scmMinTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      // Service Bus triggers need no inbound traffic: refuse all HTTP to the app, keep scm
      // (deployments) reachable with Entra ID.
      ipSecurityRestrictionsDefaultAction: 'Deny'
      scmIpSecurityRestrictionsUseMain: false
      scmIpSecurityRestrictionsDefaultAction: 'Allow'
      appSettings: appSettings
    }
  }
}

// Deployments authenticate with Entra ID: no FTP or basic-auth publishing credentials.
resource ftpBasicAuth 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmBasicAuth 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'scm'
  properties: {
    allow: false
  }
}

output appName string = site.name
output defaultHostName string = site.properties.defaultHostName
