// One commands entity (functions -> agents, docs/transports.md) and its data-plane roles. servicebus.bicep
// deploys it once per shard: shard 0 is `maintenance-commands`, shard k `maintenance-commands-<k>`
// (docs/deploy.md, "Large fleets: commands shards"), each with the same settings.
// - queue mode: a session queue (one session per VM, SessionId = VM name); the functions send to
//   it, the agents' shared identity receives from it
// - topic mode: a topic; the functions send to it, and each VM of this shard receives from its own
//   subscription only (vm-commands-subscription.bicep): no agent role on the topic

targetScope = 'resourceGroup'

@description('The Service Bus namespace (in this resource group).')
param namespaceName string

@description('The entity\'s name: `maintenance-commands` for shard 0, `maintenance-commands-<k>` for shard k.')
@minLength(1)
@maxLength(260)
param entityName string

@description('queue: a session queue the agents\' identity receives from; topic: a topic, whose per-VM subscriptions come from vm-commands-subscription.bicep.')
@allowed([
  'queue'
  'topic'
])
param commandsMode string

@description('Principal (object) id of the function app\'s identity: Data Sender on the entity.')
param functionPrincipalId string

@description('Principal (object) id of the agents\' (VMs\') identity: Data Receiver on the queue (queue mode only).')
param agentPrincipalId string

var commandsViaTopic = commandsMode == 'topic'

// Built-in role definitions (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles)
var serviceBusDataSenderRoleId = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
var serviceBusDataReceiverRoleId = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: namespaceName
}

resource commandsQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = if (!commandsViaTopic) {
  parent: namespace
  name: entityName
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
  name: entityName
  properties: {
    requiresDuplicateDetection: true // MessageId = command_id: a re-sent command is dropped
    duplicateDetectionHistoryTimeWindow: 'PT10M'
    // A command's default lifetime (docs/contracts.md#command-fields: expires_at = issued_at + 10 minutes).
    defaultMessageTimeToLive: 'PT10M'
    supportOrdering: true // one VM's commands in the order they were sent
    enablePartitioning: false
  }
}

// Session caveat (docs/security.md#commands-on-azure-who-can-take-them): Service Bus roles cannot be scoped to a session, so this lets
// every VM open any session of the queue. A compromised VM could read, take or hold another VM's
// commands, but it can never make an agent approve an event that is not its own (each agent
// re-checks the target and the event's Resources against its own IMDS); a lost approval means
// Azure starts the event at its NotBefore. commandsMode = 'topic' gives each VM its own subscription.
// The VMs sharing the identity fall in every shard, so it holds the role on every shard queue.
resource agentReceivesCommands 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!commandsViaTopic) {
  name: guid(commandsQueue.id, agentPrincipalId, serviceBusDataReceiverRoleId)
  scope: commandsQueue
  properties: {
    principalId: agentPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiverRoleId)
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

@description('The entity\'s name (the queue, or the topic in the topic mode).')
output entityName string = commandsViaTopic ? commandsTopic.name : commandsQueue.name
