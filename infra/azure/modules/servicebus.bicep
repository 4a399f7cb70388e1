// The bus between the agents and the functions (docs/architecture.md, docs/transports.md):
// - topic `maintenance-events`: agents publish envelopes, duplicate detection on MessageId
// - its subscription for the function app, and `operator-results` for `mbridge approve`
// - queue `maintenance-commands`: one session per VM (SessionId = VM name); or, with
//   commandsMode = 'topic', topic `maintenance-commands`, whose subscriptions (one per VM, each
//   readable by that VM's identity only) come from vm-commands-subscription.bicep
// Entra ID only: SAS keys are disabled on the namespace, every reader and writer gets a
// data-plane role on the one entity it uses, never on the namespace.

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

var commandsViaTopic = commandsMode == 'topic'

var eventsTopicName = 'maintenance-events'
var operatorResultsSubscriptionName = 'operator-results'
var commandsQueueName = 'maintenance-commands'
// The same name: a deployment has the queue or the topic, never both.
var commandsTopicName = 'maintenance-commands'
var commandResultsFilter = 'type LIKE \'org.maintenancebridge.command.%\''

// Built-in role definitions (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles)
var serviceBusDataSenderRoleId = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
var serviceBusDataReceiverRoleId = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
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

resource commandsQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = if (!commandsViaTopic) {
  parent: namespace
  name: commandsQueueName
  properties: {
    requiresSession: true // SessionId = target VM: each agent locks its own session
    // The agent renews the session lock before each wait (docs/transports.md).
    lockDuration: 'PT1M'
    // A command's default lifetime (docs/contracts.md#command-fields: expires_at = issued_at + 10 minutes).
    defaultMessageTimeToLive: 'PT10M'
    requiresDuplicateDetection: true // MessageId = command_id: a re-sent command is dropped
    duplicateDetectionHistoryTimeWindow: 'PT10M'
    maxDeliveryCount: 10
    // An expired command is useless (the agent would reject it anyway) and nobody replays
    // approvals from a dead-letter queue: let it go instead of piling it up.
    deadLetteringOnMessageExpiration: false
    enablePartitioning: false
  }
}

// The isolated mode: the functions send each command here with the application property `target`;
// each VM's subscription (vm-commands-subscription.bicep) filters on it.
resource commandsTopic 'Microsoft.ServiceBus/namespaces/topics@2024-01-01' = if (commandsViaTopic) {
  parent: namespace
  name: commandsTopicName
  properties: {
    requiresDuplicateDetection: true // MessageId = command_id: a re-sent command is dropped
    duplicateDetectionHistoryTimeWindow: 'PT10M'
    // A command's default lifetime (docs/contracts.md#command-fields: expires_at = issued_at + 10 minutes).
    defaultMessageTimeToLive: 'PT10M'
    supportOrdering: true // one VM's commands in the order they were sent
    enablePartitioning: false
  }
}

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

// Session caveat (docs/security.md#commands-on-azure-who-can-take-them): Service Bus roles cannot be scoped to a session, so this lets
// every VM open any session of the queue. A compromised VM could read, take or hold another VM's
// commands, but it can never make an agent approve an event that is not its own (each agent
// re-checks the target and the event's Resources against its own IMDS); a lost approval means
// Azure starts the event at its NotBefore. commandsMode = 'topic' gives each VM its own subscription.
resource agentReceivesCommands 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!commandsViaTopic) {
  name: guid(commandsQueue.id, agentPrincipalId, serviceBusDataReceiverRoleId)
  scope: commandsQueue
  properties: {
    principalId: agentPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiverRoleId)
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

// The function app sends approve/drain/restore commands.
resource functionSendsCommands 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!commandsViaTopic) {
  name: guid(commandsQueue.id, functionPrincipalId, serviceBusDataSenderRoleId)
  scope: commandsQueue
  properties: {
    principalId: functionPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSenderRoleId)
    principalType: 'ServicePrincipal'
  }
}

// In the isolated mode, onto the topic. The agents get no role here: each VM receives from its own
// subscription only (vm-commands-subscription.bicep).
resource functionSendsCommandsToTopic 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (commandsViaTopic) {
  name: guid(commandsTopic.id, functionPrincipalId, serviceBusDataSenderRoleId)
  scope: commandsTopic
  properties: {
    principalId: functionPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSenderRoleId)
    principalType: 'ServicePrincipal'
  }
}

@description('FQDN of the namespace (`<name>.servicebus.windows.net`), the host of its serviceBusEndpoint.')
output namespaceFqdn string = split(split(namespace.properties.serviceBusEndpoint, '/')[2], ':')[0]
output namespaceName string = namespace.name
output eventsTopicName string = eventsTopic.name
output functionSubscriptionName string = functionSubscription.name
output operatorResultsSubscriptionName string = operatorResultsSubscription.name
@description('The commands queue; empty in the topic mode.')
output commandsQueueName string = commandsViaTopic ? '' : commandsQueue.name
@description('The commands topic; empty in the queue mode.')
output commandsTopicName string = commandsViaTopic ? commandsTopic.name : ''
