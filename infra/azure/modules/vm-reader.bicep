// The built-in role Reader for the function app's identity on one resource group that holds VMs
// running the agent. The function resolves the vmId of an agent's attested document to the VM's
// name through the compute API (functions/azure_app/vm_directory.py, docs/azure.md "Resolving a
// VM's identity"), which needs virtualMachines/read, virtualMachineScaleSets/read and
// virtualMachineScaleSets/virtualMachines/read. Reader is the narrowest built-in role with them
// and no write, action or data action; it reads every resource of its scope, hence one resource
// group at a time and never the subscription. main.bicep deploys this once per group of
// trustResourceGroups, into that group.

targetScope = 'resourceGroup'

@description('Principal (object) id of the function app\'s identity.')
param principalId string

var readerRoleId = 'acdd72a7-3385-48ef-bd42-f606fba81ae7'

resource readsVms 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, principalId, readerRoleId)
  properties: {
    principalId: principalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', readerRoleId)
    principalType: 'ServicePrincipal'
  }
}
