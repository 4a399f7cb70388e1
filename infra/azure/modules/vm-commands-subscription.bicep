// One VM's commands in the isolated mode (commandsMode = 'topic', docs/azure.md): a subscription of
// the commands topic that passes only the messages whose application property `target` is this
// VM, and the Azure Service Bus Data Receiver role on that subscription alone for this VM's own
// managed identity (user- or system-assigned). Unlike a session of the shared queue, no other VM
// can read, take or hold up these commands: roles can be scoped to a subscription, not to a session.
// The agent authenticates with that one identity for everything, so it also gets Data Sender on the
// events topic (eventsTopicName; empty: granted elsewhere).
//
// Isolation needs an identity per VM. The VMs of a scale set share the scale set's identity: give
// them the queue mode instead (one subscription per instance would let every instance read all).
//
// Deploy it into the namespace's resource group, once per VM: main.bicep does so for each entry of
// commandsSubscriptionVms, or call it from a template of your own:
//
//   module web0Commands 'modules/vm-commands-subscription.bicep' = {
//     name: 'commands-web-0'
//     scope: resourceGroup('<namespace resource group>')
//     params: { namespaceName: '<namespace>', topicName: 'maintenance-commands', vmName: 'web-0', principalId: vm.identity.principalId }
//   }
//
// topicName is the VM's shard's topic. With one commands topic (commandsShards = 1) that is
// `maintenance-commands`; with several, the one `mbridge commands-entity --vm web-0 --shards N`
// prints (shard = SHA-256 of the lower-cased name, which Bicep cannot compute). On another topic
// the VM's commands never reach its subscription.
//
// The agent on that VM then sets MBRIDGE_SERVICEBUS_COMMANDS_SUBSCRIPTION to the output subscriptionName.

targetScope = 'resourceGroup'

@description('The Service Bus namespace of the commands topic (in this resource group).')
param namespaceName string

@description('The VM\'s commands topic (commandsMode = \'topic\'): its shard\'s, `mbridge commands-entity --vm <vmName> --shards <commandsShards>` prints it; `maintenance-commands` when the deployment has one.')
param topicName string = 'maintenance-commands'

@description('The VM\'s name exactly as its Scheduled Events name it in Resources (IMDS compute name): the commands\' `target`. At most 47 characters, so that the subscription name fits in 50.')
@minLength(1)
@maxLength(47)
param vmName string

@description('Principal (object) id of the VM\'s own managed identity: the only principal that may receive from the subscription.')
param principalId string

@description('The events topic the VM\'s agent publishes to with the same identity: Data Sender on it is granted here too. Empty: no role on the events topic (granted elsewhere).')
param eventsTopicName string = 'maintenance-events'

@description('How long a received command stays locked for the agent; it completes the command once it recorded what it did (docs/transports.md).')
@allowed([
  'PT30S'
  'PT1M'
  'PT2M'
  'PT5M'
])
param lockDuration string = 'PT1M'

var subscriptionName = 'vm-${vmName}'

// Built-in role definitions (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles)
var serviceBusDataReceiverRoleId = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
var serviceBusDataSenderRoleId = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: namespaceName
}

resource topic 'Microsoft.ServiceBus/namespaces/topics@2024-01-01' existing = {
  parent: namespace
  name: topicName
}

resource eventsTopic 'Microsoft.ServiceBus/namespaces/topics@2024-01-01' existing = if (!empty(eventsTopicName)) {
  parent: namespace
  name: eventsTopicName
}

resource commandsSubscription 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2024-01-01' = {
  parent: topic
  name: subscriptionName
  properties: {
    requiresSession: false // one reader: this VM's agent; its ledger keeps execute_at and ids
    lockDuration: lockDuration
    // A command's default lifetime (docs/contracts.md#command-fields: expires_at = issued_at + 10 minutes).
    defaultMessageTimeToLive: 'PT10M'
    maxDeliveryCount: 10
    // An expired command is useless (the agent would reject it anyway): let it go.
    deadLetteringOnMessageExpiration: false
    deadLetteringOnFilterEvaluationExceptions: true
  }
}

// A subscription created through ARM gets a `$Default` rule that matches everything; writing a
// rule of that name replaces its filter, so only this VM's commands reach the subscription. A
// correlation filter compares the property exactly: no SQL text is built from the VM's name.
resource onlyThisVm 'Microsoft.ServiceBus/namespaces/topics/subscriptions/rules@2024-01-01' = {
  parent: commandsSubscription
  name: '$Default'
  properties: {
    filterType: 'CorrelationFilter'
    correlationFilter: {
      properties: {
        target: vmName
      }
    }
  }
}

// Receive (and complete) on this subscription only: nothing on the topic or the namespace. Granted
// once the filter is in place: what the `$Default` rule let in before is other VMs' commands.
resource vmReceivesItsCommands 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(commandsSubscription.id, principalId, serviceBusDataReceiverRoleId)
  scope: commandsSubscription
  properties: {
    principalId: principalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiverRoleId)
    // A managed identity (system- or user-assigned): no directory lookup of a just-created identity.
    principalType: 'ServicePrincipal'
  }
  dependsOn: [
    onlyThisVm
  ]
}

// The agent publishes its events (and command results) with the same identity: the events topic only.
resource vmSendsEvents 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(eventsTopicName)) {
  name: guid(eventsTopic.id, principalId, serviceBusDataSenderRoleId)
  scope: eventsTopic
  properties: {
    principalId: principalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSenderRoleId)
    principalType: 'ServicePrincipal'
  }
}

@description('The subscription\'s name: MBRIDGE_SERVICEBUS_COMMANDS_SUBSCRIPTION of the VM\'s agent.')
output subscriptionName string = commandsSubscription.name
output subscriptionId string = commandsSubscription.id
