// The control plane's path (docs/architecture.md, "Two paths"; docs/azure.md, "The control plane's
// reports"): Azure's own Scheduled Events of the subscription, raised on the Event Grid system topic
// of type Microsoft.ResourceNotifications.MaintenanceResources, delivered into the Service Bus queue
// `maintenance-central`, which the function app's `maintenance_central` trigger reads.
// - the queue: redelivered, then dead-lettered, as the function's events subscription is
// - the system topic (location global, source: this subscription), with a system-assigned identity
// - its event subscription: ScheduledEventEmitted only, Event Grid schema, delivered with that
//   identity (deliveryWithResourceIdentity), so nothing on the path holds a key
// - roles: the system topic's identity is the queue's only sender (Azure Service Bus Data Sender on
//   the queue), the function app's identity its only receiver (Data Receiver on the queue)
// A preview of Microsoft's: the subscription needs the features SendScheduledEventsPolicy
// (Microsoft.Compute) and ScheduledEventsActivity (Microsoft.Maintenance) registered (docs/deploy.md).

targetScope = 'resourceGroup'

@description('The Service Bus namespace (in this resource group).')
param namespaceName string

@description('Name of the system topic (one per subscription and topic type).')
@minLength(3)
@maxLength(128)
param systemTopicName string

@description('Tags for every resource.')
param tags object

@description('Principal (object) id of the function app\'s identity: Data Receiver on the queue.')
param functionPrincipalId string

var queueName = 'maintenance-central'
var scheduledEventEmitted = 'Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted'

// Built-in role definitions (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles)
var serviceBusDataSenderRoleId = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
var serviceBusDataReceiverRoleId = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: namespaceName
}

resource centralQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = {
  parent: namespace
  name: queueName
  properties: {
    // As the function's events subscription: the host renews the 5-minute lock for up to 10
    // minutes (host.json); after 10 failed invocations a message is dead-lettered, where it waits
    // to be resubmitted once the cause is fixed.
    maxDeliveryCount: 10
    lockDuration: 'PT5M'
    defaultMessageTimeToLive: 'P14D'
    deadLetteringOnMessageExpiration: true
    requiresSession: false
    enablePartitioning: false
  }
}

// Azure raises the subscription's Scheduled Events here; nobody else publishes to a system topic.
resource systemTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' = {
  name: systemTopicName
  location: 'global'
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: subscription().id
    topicType: 'Microsoft.ResourceNotifications.MaintenanceResources'
  }
}

// The queue's only sender: the system topic's own identity.
resource systemTopicSendsCentral 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  // The principal id is known only once the topic exists, and a name must be known before: the
  // topic's name stands for its identity.
  name: guid(centralQueue.id, systemTopic.name, serviceBusDataSenderRoleId)
  scope: centralQueue
  properties: {
    principalId: systemTopic.identity.principalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSenderRoleId)
    principalType: 'ServicePrincipal'
  }
}

// The queue trigger `maintenance_central` receives, and nothing more: these reports are few (one
// per step of a maintenance), so incremental scaling (Listen only) is enough here, unlike the events
// subscription, whose trigger holds Data Owner to scale to a wave's backlog (docs/azure.md).
resource functionReceivesCentral 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(centralQueue.id, functionPrincipalId, serviceBusDataReceiverRoleId)
  scope: centralQueue
  properties: {
    principalId: functionPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiverRoleId)
    principalType: 'ServicePrincipal'
  }
}

// ScheduledEventEmitted only, in the Event Grid schema (functions/central/event_grid.py reads both),
// delivered with the system topic's identity. Event Grid retries a failed delivery for up to a day
// (30 attempts); the queue then redelivers to the function and dead-letters what keeps failing.
resource scheduledEventsToQueue 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = {
  parent: systemTopic
  name: 'maintenance-central'
  properties: {
    eventDeliverySchema: 'EventGridSchema'
    filter: {
      includedEventTypes: [
        scheduledEventEmitted
      ]
    }
    deliveryWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      destination: {
        endpointType: 'ServiceBusQueue'
        properties: {
          resourceId: centralQueue.id
        }
      }
    }
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
  }
  // Delivery with the identity needs its role on the queue first.
  dependsOn: [
    systemTopicSendsCentral
  ]
}

@description('The queue the control plane\'s reports arrive on (MBRIDGE_CENTRAL_QUEUE).')
output queueName string = centralQueue.name
output systemTopicName string = systemTopic.name
@description('Principal id of the system topic\'s identity, the queue\'s only sender.')
output systemTopicPrincipalId string = systemTopic.identity.principalId
