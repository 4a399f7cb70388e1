// maintenance-bridge on Azure, in one resource group deployment:
//
//   az deployment group create -g <resource group> -f infra/azure/main.bicep \
//     -p infra/azure/main.parameters.json
//
// - Service Bus: topic `maintenance-events` (agents -> functions), its subscriptions for the
//   function app and for `mbridge approve` (`operator-results`), queue `maintenance-commands`
//   (functions -> agents, one session per VM); or, with commandsMode = 'topic', topic
//   `maintenance-commands` and one subscription per VM of commandsSubscriptionVms, each readable
//   by that VM's own identity only (modules/vm-commands-subscription.bicep). With commandsShards
//   = N > 1, N such queues or topics: `maintenance-commands`, `maintenance-commands-1`, ...
//   (modules/commands-entity.bicep)
// - the function app on Flex Consumption, its storage (host, deployment package, state and audit
//   tables) and its telemetry (Log Analytics + Application Insights)
// - diagnostic settings of the signing key's Key Vault (AuditEvent), the namespace and the
//   function app to the Log Analytics workspace, and an alert on dead-lettered messages
//   (modules/diagnostics.bicep)
// - two user-assigned identities, one for the function app and one for the VMs (agents), each
//   with data-plane roles on the entities it uses and nothing broader
// - Reader for the function identity on the resource groups of the VMs (trustResourceGroups;
//   default: this one), where it resolves an agent's attested vmId to the VM's name
// - the Ed25519 key pair of signed commands, given as parameters (Bicep cannot generate one):
//   the private key becomes the function app's MBRIDGE_SIGNING_KEY, the public key the agents'
//   MBRIDGE_VERIFY_KEY; agents refuse to start without one (docs/deploy.md, "Signing keys")
// - the control plane's path (centralReports, on by default): an Event Grid system topic of the
//   subscription's Scheduled Events delivering into the queue `maintenance-central` with its own
//   identity, the queue's only sender (modules/central-reports.bicep)
// - optionally: the "Maintenance Bridge Drainer" custom role on an existing load balancer, its
//   NICs' resource group and its virtual network (drainLoadBalancerName), and an example scale
//   set that runs the agent (deployExampleScaleSet)
//
// Names are namePrefix plus uniqueString(resourceGroup().id): stable for one resource group,
// unique across resource groups. Nothing is authenticated with a key: shared keys and SAS are
// disabled on the storage account and on the namespace. The one secret is the command signing
// key, a secure parameter that goes into a Key Vault of this deployment (or a Key Vault secret of
// your own, signingKeySecretUri); the app setting is a Key Vault reference to it.
//
// After the deployment, publish the function app (`func azure functionapp publish
// <functionAppName>` uploads the package to deploymentContainerUrl) and give the agents' VMs
// the agent identity (outputs agentIdentityId, agentIdentityClientId), as the example scale
// set does.

targetScope = 'resourceGroup'

@description('Prefix of every name: 3-11 lowercase letters and digits (it is part of the storage account name, which takes nothing else).')
@minLength(3)
@maxLength(11)
param namePrefix string = 'mbridge'

@description('Azure region of every resource.')
param location string = resourceGroup().location

@description('Tags for every resource.')
param tags object = {
  application: 'maintenance-bridge'
}

@description('Service Bus tier: Standard has everything needed (topics, sessions, duplicate detection); Premium adds isolation and private endpoints.')
@allowed([
  'Standard'
  'Premium'
])
param serviceBusSku string = 'Standard'

@description('How long the events topic remembers MessageIds: an envelope republished within it is dropped. At least 10 minutes; make it longer than the longest outage an agent should ride out.')
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
param eventsDuplicateDetectionWindow string = 'P1D'

@description('Name of the events topic subscription the function app consumes.')
@minLength(1)
@maxLength(50)
param functionSubscriptionName string = 'functions'

@description('How commands reach the agents. queue: one session per VM of a shared queue; the agents\' identity may open any session, so a VM could read or take another VM\'s commands (it cannot forge them). topic: one subscription per VM of a commands topic, readable by that VM\'s own identity only; for standalone VMs with identities of their own (the VMs of a scale set share one identity: keep them on queue). No example scale set in topic mode.')
@allowed([
  'queue'
  'topic'
])
param commandsMode string = 'queue'

@description('How many commands entities (queues, or topics in topic mode) the VMs are spread over (MBRIDGE_COMMANDS_SHARDS; the shard of a VM is SHA-256 of its lower-cased name: `mbridge commands-entity --vm NAME --shards N`). Service Bus allows 2,000 subscriptions per topic and 5,000 concurrent receive requests per entity (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas). Shard 0 is `maintenance-commands`, shard k `maintenance-commands-<k>`, each with the same settings and roles (output commandsEntities). Change it outside a maintenance wave (docs/deploy.md).')
@minValue(1)
@maxValue(1024)
param commandsShards int = 1

@description('How many VMs this deployment serves, for the quota checks: at the peak 30 % of them are engaged at once, each holding a receive on its commands entity and 2 AMQP connections. Service Bus allows 5,000 concurrent receive requests per entity, 5,000 AMQP connections per namespace and 2,000 subscriptions per topic (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas): past the connections, split the fleet over several deployments (resource groups).')
@minValue(1)
param fleetSize int = 1000

@description('topic mode: the VMs to give a commands subscription, each { name: VM name as Scheduled Events name it, principalId: principal id of that VM\'s own managed identity, topic: that VM\'s commands topic }. topic is required with commandsShards above 1 (Bicep has no SHA-256 to compute a VM\'s shard): what `mbridge commands-entity --vm NAME --shards N` prints; with one shard it may be left out. More can be added later with modules/vm-commands-subscription.bicep.')
param commandsSubscriptionVms array = []

@description('Replication of the storage account (only zone- or geo-redundant: the audit table is the record of every approval). Use Standard_GRS where the region has no availability zones.')
@allowed([
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_GZRS'
  'Standard_RAGRS'
  'Standard_RAGZRS'
])
param storageSku string = 'Standard_ZRS'

@description('Days the Log Analytics workspace keeps logs.')
@minValue(30)
@maxValue(730)
param logRetentionInDays int = 30

@description('Upper bound of the function app\'s instances (Flex Consumption takes 40 to 1000).')
@minValue(40)
@maxValue(1000)
param functionMaximumInstanceCount int = 40

@description('Memory of each function app instance, in MB.')
@allowed([
  512
  2048
  4096
])
param functionInstanceMemoryMB int = 2048

@description('The decision policy as JSON or YAML (docs/policy.md); empty for the default policy.')
param policy string = ''

@description('MBRIDGE_READINESS_DRAIN: also drain through the agents\' /readyz (drain/restore commands), for health-probe based load balancing; false: through the load balancer\'s pools only (drainLoadBalancerName).')
param readinessDrain bool = true

@description('MBRIDGE_TELEMETRY (docs/operations.md#telemetry): off, or azure-monitor for a span and metrics of each invocation in this deployment\'s Application Insights, sent with the function identity (which holds Monitoring Metrics Publisher on the component either way: the Functions host sends its own logs there with it).')
@allowed([
  'off'
  'azure-monitor'
])
param telemetry string = 'off'

@secure()
@description('Where the functions post a notice of each decision and action (MBRIDGE_WEBHOOK_URL, docs/operations.md#notifications); empty for none. It holds the webhook\'s key: give a Key Vault reference, @Microsoft.KeyVault(SecretUri=...), to a secret the function identity may read (output functionIdentityPrincipalId), or the https URL itself, which then sits in the app settings.')
param webhookUrl string = ''

@description('The JSON body of each notice, with ${placeholders} (MBRIDGE_WEBHOOK_TEMPLATE); empty for the default, which Slack and Teams incoming webhooks take.')
param webhookTemplate string = ''

@description('Which audit records are posted, comma-separated (MBRIDGE_WEBHOOK_ACTIONS); empty for the default (decisions, actions and refusals).')
param webhookActions string = ''

@secure()
@description('The Ed25519 private key that signs commands (MBRIDGE_SIGNING_KEY): unencrypted PKCS#8 PEM, or the raw 32-byte key as base64 (docs/deploy.md, "Signing keys"). Stored as a secret of a Key Vault of this deployment, which the function identity alone may read; the app setting refers to it. Required unless signingKeySecretUri is given: agents run no unsigned command.')
param signingKey string = ''

@description('Instead of signingKey: the Key Vault secret URI (https://<vault>.vault.azure.net/secrets/<name>) holding that private key, resolved by the function identity. Grant it "Key Vault Secrets User" on that secret yourself: the vault is not part of this deployment.')
param signingKeySecretUri string = ''

@description('Resource groups (of this subscription) holding the VMs that run the agent. The function identity gets Reader on each, to resolve an agent\'s attested vmId to its VM name (MBRIDGE_TRUST_RESOURCE_GROUPS). Empty: this resource group. VMs elsewhere need Reader on their group, granted by you.')
param trustResourceGroups array = []

@description('Subscription ids (GUIDs) whose VMs may report (MBRIDGE_TRUST_SUBSCRIPTIONS): a report is acted on only with an attested document of a VM of one of them. Empty: this subscription. The Reader role above is granted in this subscription only.')
param trustSubscriptions array = []

@description('The control plane\'s path (docs/azure.md, "The control plane\'s reports"): an Event Grid system topic of type Microsoft.ResourceNotifications.MaintenanceResources on this subscription, its subscription delivering ScheduledEventEmitted into the Service Bus queue maintenance-central with the topic\'s own identity, MBRIDGE_CENTRAL_QUEUE and MBRIDGE_CENTRAL_RECONCILE for the function app, and the example scale set\'s scheduled-events policy publishing to Event Grid and Resource Graph. A Microsoft preview: register the features SendScheduledEventsPolicy (Microsoft.Compute) and ScheduledEventsActivity (Microsoft.Maintenance) first (docs/deploy.md), or set false. One such system topic per subscription.')
param centralReports bool = true

@description('Existing load balancer to drain VMs from through its backend pools (in this subscription). Empty: VMs are drained through the agents\' /readyz only and no control-plane role is granted.')
param drainLoadBalancerName string = ''

@description('How a VM is taken out of the drain load balancer (MBRIDGE_LB_DRAIN, docs/azure.md "Admin state or pool edits"): admin-state sets its backend pool entries Down (no new connections, established ones kept; reaches uniform scale sets; the role writes backend pools only, never a NIC); pool-edit rewrites its NICs\' and pools\' memberships (the role also writes NICs and joins what they link to). Change it outside a maintenance wave: a drain is restored with the permissions of the method that made it.')
@allowed([
  'admin-state'
  'pool-edit'
])
param drainMethod string = 'admin-state'

@description('Resource group of the drain load balancer. Empty: this resource group.')
param drainLoadBalancerResourceGroup string = ''

@description('Resource group of the NICs of the VMs behind it. Empty: the load balancer\'s resource group.')
param drainNicResourceGroup string = ''

@description('Virtual network of those NICs: required with drainLoadBalancerName (every NIC write is checked for subnets/join on it; IP-based pools need joinLoadBalancer on it). The deployment fails when a load balancer is given without it.')
param drainVirtualNetworkName string = ''

@description('Resource group of that virtual network. Empty: the load balancer\'s resource group.')
param drainVirtualNetworkResourceGroup string = ''

@description('Name of the custom drain role. Role names are unique in the tenant: give a second deployment in the same tenant another name.')
param drainerRoleName string = 'Maintenance Bridge Drainer'

@description('Resource id of an action group (/subscriptions/.../providers/Microsoft.Insights/actionGroups/<name>) the dead-letter alert notifies. Empty: the alert is deployed and fires in Azure Monitor without notifying anyone (the deployment knows no receiver of yours); attach one later here or with an alert processing rule (docs/azure.md, "Logs, audit and alerts").')
param alertActionGroupId string = ''

@description('Deploy the example scale set that runs the agent (needs adminSshPublicKey). Queue mode only: its VMs share one identity, which the topic mode cannot isolate.')
param deployExampleScaleSet bool = false

@description('How long a scale set VM being deleted may hold its Terminate event before Azure approves it (ISO 8601, 5 to 15 minutes).')
@allowed([
  'PT5M'
  'PT6M'
  'PT7M'
  'PT8M'
  'PT9M'
  'PT10M'
  'PT11M'
  'PT12M'
  'PT13M'
  'PT14M'
  'PT15M'
])
param terminateNotBeforeTimeout string = 'PT10M'

@description('The agent the example VMs install (MBRIDGE_PACKAGE): the agent\'s artifact, <URL of mbridge-agent-servicebus-X.Y.Z.pex>#sha256=<its 64 hex digits> (make agent-artifact writes both), which the installer checks before running anything from it (infra/agent/README.md). Required with deployExampleScaleSet; no default.')
param agentPackage string = ''

@description('MBRIDGE_VERIFY_KEY of the example VMs: the public key of signingKey as one line (the raw 32-byte key as base64, docs/deploy.md "Signing keys"). Required with deployExampleScaleSet: the agents refuse to start without it.')
param agentVerifyKey string = ''

@description('Administrator of the example VMs (SSH key only).')
param adminUsername string = 'azureuser'

@description('SSH public key of that administrator; required with deployExampleScaleSet.')
param adminSshPublicKey string = ''

@description('Size of the example VMs (Gen2 and Trusted Launch capable).')
param vmSize string = 'Standard_B2s'

@description('Number of example VMs.')
@minValue(1)
@maxValue(100)
param instanceCount int = 2

@description('Encryption at host for the example VMs; needs the subscription feature Microsoft.Compute/EncryptionAtHost.')
param encryptionAtHost bool = false

var suffix = uniqueString(resourceGroup().id)
var commandsViaTopic = commandsMode == 'topic'
// The commands entities, shard 0 first: the base name, then `<base>-<k>` (wire/shards.py).
var commandsEntityBaseName = 'maintenance-commands'
var commandsEntityNames = [
  for shard in range(0, commandsShards): (shard == 0) ? commandsEntityBaseName : '${commandsEntityBaseName}-${shard}'
]
// topic mode: each VM of commandsSubscriptionVms gets its subscription on the topic it is given
// (`topic`), or on the one topic when there is one shard and it gives none. Bicep has no SHA-256
// to compute a VM's shard, so with several shards a VM without a topic, or with a topic that is
// none of commandsEntityNames, stops the deployment (a wrong shard of the right form cannot be
// told: `mbridge commands-entity --vm NAME --shards N` prints the right one).
var commandsSubscriptionTopicChecks = [
  for vm in commandsSubscriptionVms: contains(vm, 'topic') ? (contains(commandsEntityNames, vm.topic) ? '' : 'commandsSubscriptionVms: the topic of ${vm.name}, \'${vm.topic}\', is not one of the ${commandsShards} commands topics of this deployment (maintenance-commands, then maintenance-commands-<k>): give what `mbridge commands-entity --vm ${vm.name} --shards ${commandsShards}` prints.') : ((commandsShards == 1) ? '' : 'commandsSubscriptionVms: ${vm.name} has no topic; with commandsShards = ${commandsShards}, Bicep cannot compute a VM\'s shard (SHA-256 of its name): give its topic, what `mbridge commands-entity --vm ${vm.name} --shards ${commandsShards}` prints.')
]
var commandsSubscriptionTopicProblems = filter(commandsSubscriptionTopicChecks, problem => !empty(problem))

// Service Bus quotas (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas):
// subscriptions per topic, concurrent receive requests per entity (a topic's subscriptions
// together), concurrent AMQP connections per namespace. The fleet model (docs/scale.md): 30 % of
// the fleet engaged at the peak (peakEngagedTenths / 10), 2 connections each; the shard of a name
// is a hash, so 10 % headroom (11 / 10) for the busiest topic; the function app at its widest
// holds per instance the trigger's connection and a sender per commands entity. Integer
// arithmetic: ceil(a / b) is (a + b - 1) / b. The same checks as infra/terraform/azure/commands_shards.tf.
var serviceBusSubscriptionsPerTopic = 2000
var serviceBusReceivesPerEntity = 5000
var serviceBusConnectionsPerNamespace = 5000
var peakEngagedTenths = 3
var connectionsPerEngagedVm = 2
var functionConnections = functionMaximumInstanceCount * (1 + commandsShards)
var peakReceivesPerEntity = (fleetSize * peakEngagedTenths + 10 * commandsShards - 1) / (10 * commandsShards)
var peakConnections = (fleetSize * peakEngagedTenths * connectionsPerEngagedVm + 9) / 10 + functionConnections
var vmsPerTopicWithSkew = (fleetSize * 11 + 10 * commandsShards - 1) / (10 * commandsShards)
// Standard's credits (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-throttling):
// 1,000 a second; a message to a topic costs 1 more per subscription filter. A freeze of 30 % of the
// fleet: per VM a report (4) and a drain and an approval command (2 each, plus the filters of its
// topic in topic mode), within a minute's 60,000. Network writes (Resource Manager throttling):
// 1,000 PUTs per 5 minutes per subscription and region; a pool drain is one NIC PUT per VM, and a
// freeze's must fit the 14 minutes an approval has: 2,800.
var peakFreezeVms = (fleetSize * peakEngagedTenths + 9) / 10
var filtersPerCommand = commandsViaTopic ? vmsPerTopicWithSkew : 0
var peakFreezeCredits = peakFreezeVms * (4 + 2 * (2 + filtersPerCommand))
var networkPutsAllowed = 2800
// Resource Manager deploys at most 800 resources per template, copies of a loop included
// (https://learn.microsoft.com/azure/azure-resource-manager/templates/best-practices#template-limits):
// modules/servicebus.bicep holds the commands entities' module loop and 7 resources of its own.
var commandsShardsPerTemplate = 793
var commandsQuotaProblems = filter([
  commandsViaTopic || empty(commandsSubscriptionVms) ? '' : 'commandsSubscriptionVms gives ${length(commandsSubscriptionVms)} VMs identities of their own, and the queue mode would let each of them read or take the others\' commands: set commandsMode = \'topic\' to give each its own subscription (docs/security.md), or leave commandsSubscriptionVms empty for the queue mode.'
  commandsShards <= commandsShardsPerTemplate ? '' : 'commandsShards is ${commandsShards}: Resource Manager deploys at most 800 resources per template, and this one takes ${commandsShardsPerTemplate} commands entities at most. Deploy more shards with the Terraform (infra/terraform/azure, commands_shards).'
  !commandsViaTopic || length(commandsSubscriptionVms) <= serviceBusSubscriptionsPerTopic ? '' : 'Service Bus allows ${serviceBusSubscriptionsPerTopic} subscriptions per topic, and commandsSubscriptionVms puts ${length(commandsSubscriptionVms)} VMs on one commands topic: raise commandsShards.'
  !commandsViaTopic || vmsPerTopicWithSkew <= serviceBusSubscriptionsPerTopic ? '' : 'Service Bus allows ${serviceBusSubscriptionsPerTopic} subscriptions per topic: a fleet of ${fleetSize} VMs over ${commandsShards} commands topic(s) puts up to ${vmsPerTopicWithSkew} VMs on one (10 % headroom for the hash\'s skew). Raise commandsShards.'
  peakReceivesPerEntity <= serviceBusReceivesPerEntity ? '' : 'Service Bus allows ${serviceBusReceivesPerEntity} concurrent receive requests per queue or topic: ${fleetSize} VMs, 30 % of them engaged at the peak, over ${commandsShards} commands entities make ${peakReceivesPerEntity} on one. Raise commandsShards.'
  serviceBusSku != 'Standard' || peakFreezeCredits <= 60000 ? '' : 'Service Bus Standard allows 1000 credits a second per namespace, and a message sent to a topic costs one more per subscription filter: a freeze of 30 % of ${fleetSize} VMs needs ${peakFreezeCredits} credits for its reports, drains and approvals, more than a minute\'s 60000. Raise commandsShards (fewer VMs per commands topic), or use serviceBusSku = \'Premium\' (no credit limit).'
  empty(drainLoadBalancerName) || peakFreezeVms <= networkPutsAllowed ? '' : 'Azure Resource Manager allows 1000 network writes (PUT) per 300 s per subscription and region, and draining through the pools of ${drainLoadBalancerName} is one NIC PUT per VM: a freeze of 30 % of ${fleetSize} VMs makes ${peakFreezeVms} drains, more than the ${networkPutsAllowed} that fit the 14 minutes an approval has. Drain through /readyz instead (drainLoadBalancerName empty, the load balancer\'s probe on /readyz), or spread the fleet over subscriptions.'
  peakConnections <= serviceBusConnectionsPerNamespace ? '' : 'Service Bus allows ${serviceBusConnectionsPerNamespace} concurrent AMQP connections per namespace: ${fleetSize} VMs, 30 % of them engaged at the peak with 2 connections each, and the function app (${functionConnections}: functionMaximumInstanceCount x (1 + commandsShards)) make ${peakConnections}. Shards do not help: split the fleet over several deployments, each in its own resource group (its own namespace), or lower functionMaximumInstanceCount.'
], problem => !empty(problem))

// Stops the deployment before the namespace when the fleet is past a Service Bus quota.
module commandsQuotaCheck 'modules/check.bicep' = {
  name: '${namePrefix}-commands-quota-check-${suffix}'
  params: {
    outcome: empty(commandsQuotaProblems) ? 'ok' : join(commandsQuotaProblems, ' ')
  }
}

// Stops the deployment before the namespace when a VM of commandsSubscriptionVms has no commands
// topic of this deployment.
module commandsTopicsCheck 'modules/check.bicep' = if (commandsViaTopic) {
  name: '${namePrefix}-commands-topics-check-${suffix}'
  params: {
    outcome: empty(commandsSubscriptionTopicProblems) ? 'ok' : join(commandsSubscriptionTopicProblems, ' ')
  }
}

var stateTableName = 'mbridgestate'
var auditTableName = 'mbridgeaudit'
var deploymentContainerName = 'app-package'

var drainEnabled = !empty(drainLoadBalancerName)
var drainLoadBalancerResourceGroupName = empty(drainLoadBalancerResourceGroup) ? resourceGroup().name : drainLoadBalancerResourceGroup
var drainNicResourceGroupName = empty(drainNicResourceGroup) ? drainLoadBalancerResourceGroupName : drainNicResourceGroup
var drainVirtualNetworkResourceGroupName = empty(drainVirtualNetworkResourceGroup) ? drainLoadBalancerResourceGroupName : drainVirtualNetworkResourceGroup
// The resource groups where the function looks VMs up by vmId, and holds Reader.
var trustResourceGroupNames = empty(trustResourceGroups) ? [resourceGroup().name] : trustResourceGroups
// The subscriptions whose VMs' attested documents are trusted.
var trustSubscriptionIds = empty(trustSubscriptions) ? [subscription().subscriptionId] : trustSubscriptions
var drainerAssignableScopes = union([toLower(resourceGroup().id)], [toLower('${subscription().id}/resourceGroups/${drainLoadBalancerResourceGroupName}')], [toLower('${subscription().id}/resourceGroups/${drainNicResourceGroupName}')], [toLower('${subscription().id}/resourceGroups/${drainVirtualNetworkResourceGroupName}')])

resource functionIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${namePrefix}-func-${suffix}'
  location: location
  tags: tags
}

resource agentIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${namePrefix}-agent-${suffix}'
  location: location
  tags: tags
}

module monitoring 'modules/monitoring.bicep' = {
  name: '${namePrefix}-monitoring'
  params: {
    workspaceName: '${namePrefix}-log-${suffix}'
    appInsightsName: '${namePrefix}-appi-${suffix}'
    location: location
    tags: tags
    retentionInDays: logRetentionInDays
    functionPrincipalId: functionIdentity.properties.principalId
  }
}

module serviceBus 'modules/servicebus.bicep' = {
  name: '${namePrefix}-servicebus'
  dependsOn: [
    commandsQuotaCheck
    commandsTopicsCheck
  ]
  params: {
    namespaceName: '${namePrefix}-sb-${suffix}'
    location: location
    tags: tags
    sku: serviceBusSku
    eventsDuplicateDetectionWindow: eventsDuplicateDetectionWindow
    functionSubscriptionName: functionSubscriptionName
    functionPrincipalId: functionIdentity.properties.principalId
    agentPrincipalId: agentIdentity.properties.principalId
    commandsMode: commandsMode
    commandsEntityNames: commandsEntityNames
  }
}

// The isolated mode: each VM's filtered subscription, on its shard's topic, and its own receiver
// role on it.
module vmCommandSubscriptions 'modules/vm-commands-subscription.bicep' = [
  for vm in commandsSubscriptionVms: if (commandsViaTopic) {
    name: '${namePrefix}-commands-${uniqueString(vm.name)}'
    params: {
      namespaceName: serviceBus.outputs.namespaceName
      topicName: contains(vm, 'topic') ? vm.topic : serviceBus.outputs.commandsTopicName
      eventsTopicName: serviceBus.outputs.eventsTopicName
      vmName: vm.name
      principalId: vm.principalId
    }
  }
]

module storage 'modules/storage.bicep' = {
  name: '${namePrefix}-storage'
  params: {
    accountName: '${namePrefix}${suffix}'
    location: location
    tags: tags
    skuName: storageSku
    deploymentContainerName: deploymentContainerName
    stateTableName: stateTableName
    auditTableName: auditTableName
    functionPrincipalId: functionIdentity.properties.principalId
  }
}

// Key Vault names take 24 characters at most and start with a letter, which namePrefix need not
// (its digits are allowed for the storage account): 'kv-', 7 of the prefix, '-' and the 13 of
// the suffix.
module signingVault 'modules/signing-vault.bicep' = if (empty(signingKeySecretUri)) {
  name: '${namePrefix}-signing-vault'
  params: {
    vaultName: 'kv-${take(namePrefix, 7)}-${suffix}'
    location: location
    tags: tags
    signingKey: signingKey
    functionPrincipalId: functionIdentity.properties.principalId
  }
}

// The control plane's path: the queue, the system topic and its subscription, their two roles
// (modules/central-reports.bicep).
module centralReportsPath 'modules/central-reports.bicep' = if (centralReports) {
  name: '${namePrefix}-central-reports'
  params: {
    namespaceName: serviceBus.outputs.namespaceName
    systemTopicName: '${namePrefix}-maintenance-${suffix}'
    tags: tags
    functionPrincipalId: functionIdentity.properties.principalId
  }
}

module functionApp 'modules/functionapp.bicep' = {
  name: '${namePrefix}-functionapp'
  params: {
    appName: '${namePrefix}-func-${suffix}'
    planName: '${namePrefix}-plan-${suffix}'
    location: location
    tags: tags
    identityId: functionIdentity.id
    identityClientId: functionIdentity.properties.clientId
    storageAccountName: storage.outputs.accountName
    deploymentContainerName: deploymentContainerName
    appInsightsName: monitoring.outputs.appInsightsName
    serviceBusNamespaceFqdn: serviceBus.outputs.namespaceFqdn
    eventsTopicName: serviceBus.outputs.eventsTopicName
    eventsSubscriptionName: serviceBus.outputs.functionSubscriptionName
    commandsQueueName: serviceBus.outputs.commandsQueueName
    commandsMode: commandsMode
    commandsTopicName: serviceBus.outputs.commandsTopicName
    commandsShards: commandsShards
    stateTableName: storage.outputs.stateTableName
    auditTableName: storage.outputs.auditTableName
    loadBalancerSubscriptionId: drainEnabled ? subscription().subscriptionId : ''
    loadBalancerResourceGroup: drainEnabled ? drainLoadBalancerResourceGroupName : ''
    loadBalancerName: drainLoadBalancerName
    loadBalancerNicResourceGroup: drainEnabled ? drainNicResourceGroupName : ''
    loadBalancerDrainMethod: drainMethod
    readinessDrain: readinessDrain
    telemetry: telemetry
    policy: policy
    webhookUrl: webhookUrl
    webhookTemplate: webhookTemplate
    webhookActions: webhookActions
    // A Key Vault reference, to this deployment's secret or to yours, which the platform resolves
    // with the function identity.
    signingKey: '@Microsoft.KeyVault(SecretUri=${empty(signingKeySecretUri) ? signingVault.outputs.secretUriWithVersion : signingKeySecretUri})'
    trustResourceGroups: join(trustResourceGroupNames, ',')
    trustSubscriptions: join(trustSubscriptionIds, ',')
    centralQueueName: centralReports ? centralReportsPath.outputs.queueName : ''
    centralReconcile: centralReports
    maximumInstanceCount: functionMaximumInstanceCount
    instanceMemoryMB: functionInstanceMemoryMB
  }
}

// Diagnostic settings of the signing vault, the namespace and the function app to the workspace,
// and the alert on dead letters (modules/diagnostics.bicep).
module diagnostics 'modules/diagnostics.bicep' = {
  name: '${namePrefix}-diagnostics'
  params: {
    settingName: '${namePrefix}-logs'
    workspaceId: monitoring.outputs.workspaceId
    vaultName: empty(signingKeySecretUri) ? signingVault.outputs.vaultName : ''
    namespaceName: serviceBus.outputs.namespaceName
    functionAppName: functionApp.outputs.appName
    deadLetterAlertName: '${namePrefix}-dead-letters-${suffix}'
    alertActionGroupId: alertActionGroupId
    tags: tags
  }
}

// Reader on each resource group of the VMs, deployed into that group: the VM directory lists
// the VMs and scale set instances there to resolve an attested vmId (modules/vm-reader.bicep).
module vmReaders 'modules/vm-reader.bicep' = [
  for group in trustResourceGroupNames: {
    name: '${namePrefix}-vm-reader-${uniqueString(group)}'
    scope: resourceGroup(group)
    params: {
      principalId: functionIdentity.properties.principalId
    }
  }
]

// A drain writes backend pools whose IP-based entries name the virtual network (joinLoadBalancer on
// it), and by pool edits writes NICs, which ARM checks for `subnets/join/action` on their subnet:
// without the drainer role on the virtual network, drains would be refused. So a load balancer
// without its virtual network stops the deployment here, before any drain role is defined or
// assigned (as Terraform's precondition does at plan time).
module drainTargetCheck 'modules/check.bicep' = if (drainEnabled) {
  name: '${namePrefix}-drain-check-${suffix}'
  params: {
    outcome: empty(drainVirtualNetworkName) ? 'drainVirtualNetworkName must be set with drainLoadBalancerName: writing an IP-based pool joins its virtual network and writing a NIC joins its subnet, so the function needs the drainer role on the virtual network of the drained VMs.' : 'ok'
  }
}

// Only what the load balancer adapter does (docs/azure.md, "A custom role for draining"):
// read and write NICs, read and write backend pools, and the join actions a NIC or pool
// write is checked for: the subnet, and the NSG, public IP, application security groups and
// inbound NAT rules a NIC may link to.
// What each drain method does, and nothing more. Both read the load balancer (its rules and
// probes), the backend pools and the NICs, and write backend pools: admin-state only sets their
// entries' state, and an IP-based pool's entries name the virtual network (joinLoadBalancer). Pool
// edits also write NICs, which ARM checks for join on the pool, the subnet and whatever else the NIC
// links to: without the NSG, public IP, application security group and NAT rule joins, the first
// drain of a VM whose NIC has them (a portal-made VM's NIC has an NSG of its own) fails with
// LinkedAuthorizationFailed (https://learn.microsoft.com/azure/virtual-network/virtual-network-network-interface#permissions).
var drainerActions = {
  'admin-state': [
    'Microsoft.Network/networkInterfaces/read'
    'Microsoft.Network/loadBalancers/read'
    'Microsoft.Network/loadBalancers/backendAddressPools/read'
    'Microsoft.Network/loadBalancers/backendAddressPools/write'
    'Microsoft.Network/virtualNetworks/joinLoadBalancer/action'
  ]
  'pool-edit': [
    'Microsoft.Network/networkInterfaces/read'
    'Microsoft.Network/loadBalancers/read'
    'Microsoft.Network/loadBalancers/backendAddressPools/read'
    'Microsoft.Network/loadBalancers/backendAddressPools/write'
    'Microsoft.Network/virtualNetworks/joinLoadBalancer/action'
    'Microsoft.Network/networkInterfaces/write'
    'Microsoft.Network/loadBalancers/backendAddressPools/join/action'
    'Microsoft.Network/virtualNetworks/subnets/join/action'
    'Microsoft.Network/networkSecurityGroups/join/action'
    'Microsoft.Network/publicIPAddresses/join/action'
    'Microsoft.Network/applicationSecurityGroups/joinIpConfiguration/action'
    'Microsoft.Network/loadBalancers/inboundNatRules/join/action'
  ]
}

resource drainerRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = if (drainEnabled) {
  name: guid(subscription().id, resourceGroup().id, drainerRoleName)
  properties: {
    roleName: drainerRoleName
    description: 'Take VMs out of one load balancer\'s backend pools and put them back: admin state of their pool entries, or their NICs\' and IP addresses\' memberships.'
    type: 'CustomRole'
    permissions: [
      {
        actions: drainerActions[drainMethod]
        notActions: []
      }
    ]
    // Resource groups only: this one and those of the drain target.
    assignableScopes: drainerAssignableScopes
  }
  dependsOn: [
    drainTargetCheck
  ]
}

// The role's id in the subscription-level form, as for the built-in roles
// (https://learn.microsoft.com/azure/azure-resource-manager/bicep/scenarios-rbac): a custom role is
// not a resource of the group it was deployed from, and `drainerRole.id` would be the
// resource-group-scoped form. Reading drainerRole.name keeps the assignments after the definition.
var drainerRoleDefinitionId = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', drainerRole.name)

module drainOnLoadBalancer 'modules/drain-roles.bicep' = if (drainEnabled) {
  name: '${namePrefix}-drain-lb-${suffix}'
  scope: resourceGroup(drainLoadBalancerResourceGroupName)
  params: {
    principalId: functionIdentity.properties.principalId
    roleDefinitionId: drainerRoleDefinitionId
    loadBalancerName: drainLoadBalancerName
  }
}

module drainOnNicResourceGroup 'modules/drain-roles.bicep' = if (drainEnabled) {
  name: '${namePrefix}-drain-nics-${suffix}'
  scope: resourceGroup(drainNicResourceGroupName)
  params: {
    principalId: functionIdentity.properties.principalId
    roleDefinitionId: drainerRoleDefinitionId
    assignOnResourceGroup: true
  }
}

module drainOnVirtualNetwork 'modules/drain-roles.bicep' = if (drainEnabled) {
  name: '${namePrefix}-drain-vnet-${suffix}'
  scope: resourceGroup(drainVirtualNetworkResourceGroupName)
  params: {
    principalId: functionIdentity.properties.principalId
    roleDefinitionId: drainerRoleDefinitionId
    virtualNetworkName: drainVirtualNetworkName
  }
}

// No default package: none is published on an index, and the installer takes only a pinned one.
// Bicep cannot match the form itself (no regular expressions); the installer refuses any other
// form at the VMs' first boot, naming what to set (infra/agent/README.md). The Terraform checks
// the form at plan time.
module agentPackageCheck 'modules/check.bicep' = if (deployExampleScaleSet && !commandsViaTopic) {
  name: '${namePrefix}-agent-package-check-${suffix}'
  params: {
    outcome: empty(agentPackage) ? 'agentPackage is required with deployExampleScaleSet: <URL of the agent\'s artifact, mbridge-agent-servicebus-X.Y.Z.pex>#sha256=<its 64 hex digits> (make agent-artifact, infra/agent/README.md); the installer takes no unpinned package.' : 'ok'
  }
}

module exampleScaleSet 'modules/vmss-example.bicep' = if (deployExampleScaleSet && !commandsViaTopic) {
  name: '${namePrefix}-vmss-example'
  dependsOn: [
    agentPackageCheck
  ]
  params: {
    scaleSetName: '${namePrefix}-vmss'
    location: location
    tags: tags
    agentIdentityId: agentIdentity.id
    agentIdentityClientId: agentIdentity.properties.clientId
    serviceBusNamespaceFqdn: serviceBus.outputs.namespaceFqdn
    commandsShards: commandsShards
    agentVerifyKey: agentVerifyKey
    agentPackage: agentPackage
    terminateNotBeforeTimeout: terminateNotBeforeTimeout
    adminUsername: adminUsername
    adminSshPublicKey: adminSshPublicKey
    vmSize: vmSize
    instanceCount: instanceCount
    encryptionAtHost: encryptionAtHost
    scheduledEventsToEventGrid: centralReports
    addressPrefix: '10.42.0.0/16'
    subnetPrefix: '10.42.0.0/24'
  }
}

@description('Service Bus namespace FQDN: --servicebus-namespace of the agents and of `mbridge approve`.')
output servicebusNamespaceFqdn string = serviceBus.outputs.namespaceFqdn
output servicebusNamespaceName string = serviceBus.outputs.namespaceName
output eventsTopic string = serviceBus.outputs.eventsTopicName
output functionSubscription string = serviceBus.outputs.functionSubscriptionName
output operatorResultsSubscription string = serviceBus.outputs.operatorResultsSubscriptionName
@description('The commands queue of shard 0 (empty in the topic mode): the agents\' MBRIDGE_COMMANDS_QUEUE, the base name of the shard queues.')
output commandsQueue string = serviceBus.outputs.commandsQueueName
@description('Every commands entity (queues, or topics in topic mode), shard 0 first.')
output commandsEntities array = serviceBus.outputs.commandsEntityNames
@description('The commands topic of shard 0 in the topic mode (empty in the queue mode), the base name of the shard topics.')
output commandsTopic string = serviceBus.outputs.commandsTopicName
@description('topic mode: MBRIDGE_SERVICEBUS_COMMANDS_SUBSCRIPTION of each VM of commandsSubscriptionVms, in its order.')
output commandsSubscriptions array = [for (vm, index) in commandsSubscriptionVms: commandsViaTopic ? vmCommandSubscriptions[index].outputs.subscriptionName : '']
output functionAppName string = functionApp.outputs.appName
@description('Run from the repository root after the deployment: reads the status of the app\'s Key Vault references (the signing key) and restarts the app until they resolve (docs/deploy.md, "After the deployment: Key Vault references").')
output keyVaultReferencesCheckCommand string = 'python3 scripts/check_keyvault_references.py --subscription ${subscription().subscriptionId} --resource-group ${resourceGroup().name} --name ${functionApp.outputs.appName} --restart'
@description('Principal id of the function identity: grant it "Key Vault Secrets User" on the signing key secret (signingKeySecretUri), and Reader on the resource groups of VMs outside trustResourceGroups.')
output functionIdentityPrincipalId string = functionIdentity.properties.principalId
@description('Client id of the agent identity: AZURE_CLIENT_ID on every VM that runs the agent.')
output agentIdentityClientId string = agentIdentity.properties.clientId
@description('Resource id of the agent identity: assign it to the VMs (scale sets) that run the agent.')
output agentIdentityId string = agentIdentity.id
output agentIdentityPrincipalId string = agentIdentity.properties.principalId
output storageAccountName string = storage.outputs.accountName
output tableEndpoint string = storage.outputs.tableEndpoint
output stateTable string = storage.outputs.stateTableName
output auditTable string = storage.outputs.auditTableName
@description('Where the function app package goes (az functionapp deployment source config-zip uploads it there).')
output deploymentContainerUrl string = storage.outputs.deploymentContainerUrl
@description('The queue of the control plane\'s reports (empty with centralReports false).')
output centralQueue string = centralReports ? centralReportsPath.outputs.queueName : ''
@description('The Event Grid system topic of the subscription\'s Scheduled Events (empty with centralReports false).')
output centralSystemTopicName string = centralReports ? centralReportsPath.outputs.systemTopicName : ''
output exampleScaleSetName string = deployExampleScaleSet && !commandsViaTopic ? exampleScaleSet.outputs.scaleSetName : ''
output exampleLoadBalancerName string = deployExampleScaleSet && !commandsViaTopic ? exampleScaleSet.outputs.loadBalancerName : ''
