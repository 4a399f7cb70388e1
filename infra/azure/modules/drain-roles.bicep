// The "Maintenance Bridge Drainer" role on the drain target, deployed into the resource group
// that holds it (role assignments must live in the scope they grant on, and the load balancer,
// the NICs and the virtual network may each sit in another resource group than the deployment).
// main.bicep calls this once per target: the load balancer, the NICs' resource group, the
// virtual network; a target left empty gets no assignment.

targetScope = 'resourceGroup'

@description('Principal (object) id of the function app\'s identity.')
param principalId string

@description('Id of the "Maintenance Bridge Drainer" role definition, in the subscription-level form (subscriptionResourceId(\'Microsoft.Authorization/roleDefinitions\', <guid>)).')
param roleDefinitionId string

@description('Assign the role on this load balancer of the resource group (its backend pools). Empty: no assignment.')
param loadBalancerName string = ''

@description('Assign the role on this virtual network of the resource group (subnets/join, joinLoadBalancer). Empty: no assignment.')
param virtualNetworkName string = ''

@description('Assign the role on the resource group itself: the one whose NICs the function lists and writes.')
param assignOnResourceGroup bool = false

resource loadBalancer 'Microsoft.Network/loadBalancers@2024-01-01' existing = if (!empty(loadBalancerName)) {
  name: loadBalancerName
}

resource virtualNetwork 'Microsoft.Network/virtualNetworks@2024-01-01' existing = if (!empty(virtualNetworkName)) {
  name: virtualNetworkName
}

resource onLoadBalancer 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(loadBalancerName)) {
  name: guid(loadBalancer.id, principalId, roleDefinitionId)
  scope: loadBalancer
  properties: {
    principalId: principalId
    roleDefinitionId: roleDefinitionId
    principalType: 'ServicePrincipal'
  }
}

// NICs come and go with the VMs: the role is on their resource group, not on each NIC.
resource onNicResourceGroup 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (assignOnResourceGroup) {
  name: guid(resourceGroup().id, principalId, roleDefinitionId)
  properties: {
    principalId: principalId
    roleDefinitionId: roleDefinitionId
    principalType: 'ServicePrincipal'
  }
}

resource onVirtualNetwork 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(virtualNetworkName)) {
  name: guid(virtualNetwork.id, principalId, roleDefinitionId)
  scope: virtualNetwork
  properties: {
    principalId: principalId
    roleDefinitionId: roleDefinitionId
    principalType: 'ServicePrincipal'
  }
}
