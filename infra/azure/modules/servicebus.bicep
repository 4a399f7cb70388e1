// The bus between the agents and the functions (docs/architecture.md, docs/transports.md):
// - topic `maintenance-events`: agents publish envelopes, duplicate detection on MessageId
// - its subscription for the function app, and `operator-results` for `mbridge approve`
// - the commands entities, one per shard (commandsEntityNames: `maintenance-commands`, then
//   `maintenance-commands-<k>`; commands-entity.bicep): queues, one session per VM (SessionId = VM
//   name); or, with commandsMode = 'topic', topics, whose subscriptions (one per VM, on its shard's
//   topic, each readable by that VM's identity only) come from vm-commands-subscription.bicep
// Entra ID only: SAS keys are disabled on the namespace, every reader and writer gets a
// data-plane role on each entity it uses, never on the namespace.

targetScope = 'resourceGroup'

@description('Service Bus namespace name (globally unique).')
param namespaceName string

@description('Azure region.')
param location string

@description('Tags for every resource.')
param tags object

@description('Standard is enough (topics, sessions, duplicate detection). Premium adds isolation and private endpoints.')
@allowed([
  'Standard'
  'Premium'
])
param sku string

@description('How long the events topic remembers MessageIds: a republished envelope inside this window is dropped. At least 10 minutes (at most 7 days, the Service Bus limit).')
@allowed([
  'PT10M'
  'PT30M'
  'PT1H'
  'PT6H'
  'PT12H'
  'P1D'
  'P2D'
  'P7D'
])
param eventsDuplicateDetectionWindow string

@description('Name of the events topic subscription the function app consumes.')
@minLength(1)
@maxLength(50)
param functionSubscriptionName string

@description('Principal (object) id of the function app\'s identity.')
param functionPrincipalId string

@description('Principal (object) id of the agents\' (VMs\') identity.')
param agentPrincipalId string

@description('How commands reach the agents: queue (one session per VM; every VM holding the agents\' role can open any session) or topic (one subscription per VM, each readable by its VM\'s own identity only; the subscriptions come from vm-commands-subscription.bicep).')
@allowed([
  'queue'
  'topic'
])
param commandsMode string

@description('The commands entities, shard 0 first: `maintenance-commands`, `maintenance-commands-1`, ... (MBRIDGE_COMMANDS_SHARDS of them; docs/deploy.md, "Large fleets: commands shards").')
@minLength(1)
@maxLength(1024)
param commandsEntityNames array

var commandsViaTopic = commandsMode == 'topic'

var eventsTopicName = 'maintenance-events'
var operatorResultsSubscriptionName = 'operator-results'
var commandResultsFilter = 'type LIKE \'org.maintenancebridge.command.%\''

// Built-in role definitions (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles)
var serviceBusDataSenderRoleId = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
var serviceBusDataOwnerRoleId = '090c5cfd-751d-490a-894a-3ce6f1109419'

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: namespaceName
  location: location
  tags: tags
  sku: {
    name: sku
    tier: sku
  }
  properties: {
    disableLocalAuth: true // no SAS keys: Microsoft Entra ID only
    minimumTlsVersion: '1.2'
    // The agents run anywhere in the VNets of the fleet and Standard has no private endpoints.
    publicNetworkAccess: 'Enabled'
  }
}

resource eventsTopic 'Microsoft.ServiceBus/namespaces/topics@2024-01-01' = {
  parent: namespace
  name: eventsTopicName
  properties: {
    // MessageId = SHA-256 of the body as sent (command results: their envelope id): an identical
    // resend is dropped, the functions' claim absorbs any other (docs/contracts.md#on-the-bus).
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: eventsDuplicateDetectionWindow
    defaultMessageTimeToLive: 'P14D'
    supportOrdering: true
    enablePartitioning: false
  }
}

resource functionSubscription 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2024-01-01' = {
  parent: eventsTopic
  name: functionSubscriptionName
  properties: {
    // Retryable failures are redelivered, then dead-lettered (docs/azure.md); the host renews
    // the lock for up to 10 minutes (host.json), 5 minutes is the longest lock Service Bus takes.
    maxDeliveryCount: 10
    lockDuration: 'PT5M'
    deadLetteringOnMessageExpiration: true
    deadLetteringOnFilterEvaluationExceptions: true
    requiresSession: false
  }
}

resource operatorResultsSubscription 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2024-01-01' = {
  parent: eventsTopic
  name: operatorResultsSubscriptionName
  properties: {
    // `mbridge approve` waits seconds for a result: an hour-old one is nobody's answer.
    maxDeliveryCount: 10
    defaultMessageTimeToLive: 'PT1H'
    lockDuration: 'PT1M'
    deadLetteringOnMessageExpiration: false
    requiresSession: false
  }
}

// A subscription created through ARM gets a `$Default` rule that matches everything; writing a
// rule of that name replaces its filter, so maintenance events never reach this subscription.
resource commandResultsOnly 'Microsoft.ServiceBus/namespaces/topics/subscriptions/rules@2024-01-01' = {
  parent: operatorResultsSubscription
  name: '$Default'
  properties: {
    filterType: 'SqlFilter'
    sqlFilter: {
      sqlExpression: commandResultsFilter
    }
  }
}

// The commands entities, one per shard (shard 0 first), each with its roles (commands-entity.bicep).
module commandsEntities 'commands-entity.bicep' = [
  for entityName in commandsEntityNames: {
    name: '${namespaceName}-${entityName}'
    params: {
      namespaceName: namespace.name
      entityName: entityName
      commandsMode: commandsMode
      functionPrincipalId: functionPrincipalId
      agentPrincipalId: agentPrincipalId
    }
  }
]

// The agents publish events and command results on the topic.
resource agentSendsEvents 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(eventsTopic.id, agentPrincipalId, serviceBusDataSenderRoleId)
  scope: eventsTopic
  properties: {
    principalId: agentPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSenderRoleId)
    principalType: 'ServicePrincipal'
  }
}

// The function app's trigger reads its own subscription only, as Data Owner rather than Data
// Receiver: the scale controller reads the subscription's message count to scale the app to the
// backlog (target-based scaling), which takes Manage rights; with Listen (Data Receiver) only it
// falls back to incremental scaling, one instance at a time
// (https://learn.microsoft.com/azure/azure-functions/functions-target-based-scaling#service-bus-queues-and-topics;
// the trigger's roles: https://learn.microsoft.com/azure/azure-functions/functions-bindings-service-bus-trigger).
// Scoped to this one subscription, it adds managing that subscription (its rules, its messages) to
// receiving from it: nothing on the topic, the other subscriptions or the namespace (docs/azure.md).
resource functionReceivesEvents 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(functionSubscription.id, functionPrincipalId, serviceBusDataOwnerRoleId)
  scope: functionSubscription
  properties: {
    principalId: functionPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataOwnerRoleId)
    principalType: 'ServicePrincipal'
  }
}

@description('FQDN of the namespace (`<name>.servicebus.windows.net`), the host of its serviceBusEndpoint.')
output namespaceFqdn string = split(split(namespace.properties.serviceBusEndpoint, '/')[2], ':')[0]
output namespaceName string = namespace.name
output eventsTopicName string = eventsTopic.name
output functionSubscriptionName string = functionSubscription.name
output operatorResultsSubscriptionName string = operatorResultsSubscription.name
@description('The commands queue of shard 0; empty in the topic mode.')
output commandsQueueName string = commandsViaTopic ? '' : commandsEntityNames[0]
@description('The commands topic of shard 0; empty in the queue mode.')
output commandsTopicName string = commandsViaTopic ? commandsEntityNames[0] : ''
@description('Every commands entity (queues, or topics in the topic mode), shard 0 first.')
output commandsEntityNames array = commandsEntityNames
