// The function app's storage account: the Functions host's own blobs (leases, keys), the Flex
// Consumption deployment package, and the two tables of the core (state and audit, docs/azure.md).
// Entra ID only: shared keys are disabled, so no connection string can exist.

targetScope = 'resourceGroup'

@description('Storage account name (3-24 lowercase letters and digits, globally unique).')
@minLength(3)
@maxLength(24)
param accountName string

@description('Azure region.')
param location string

@description('Tags for every resource.')
param tags object

@description('Replication. The audit table is the record of every approval, so only zone- or geo-redundant SKUs are allowed (Standard_GRS where the region has no availability zones).')
@allowed([
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_GZRS'
  'Standard_RAGRS'
  'Standard_RAGZRS'
])
param skuName string

@description('Blob container of the Flex Consumption deployment package.')
param deploymentContainerName string

@description('Table of idempotency claims, budgets, drains and waiting events.')
param stateTableName string

@description('Append-only audit table.')
param auditTableName string

@description('Principal (object) id of the function app\'s identity.')
param functionPrincipalId string

// Built-in role definitions (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles)
var storageTableDataContributorRoleId = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
var storageBlobDataOwnerRoleId = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_35:The Flex Consumption app has no VNet integration here and reaches its host storage over the public endpoint; every request needs an Entra ID token (shared keys disabled).
  // checkov:skip=CKV_AZURE_59:Public network access stays on for the Functions host (no VNet integration); anonymous access is off (allowBlobPublicAccess false) and shared keys are disabled.
  // checkov:skip=CKV_AZURE_206:Replication is the skuName parameter, whose allowed values are all zone- or geo-redundant; checkov cannot evaluate parameters.
  // checkov:skip=CKV_AZURE_43:The name is namePrefix (3-11 lowercase letters/digits) + uniqueString() (13 lowercase letters/digits), computed at deployment; checkov cannot evaluate it.
  name: accountName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: skuName
  }
  properties: {
    accessTier: 'Hot'
    allowSharedKeyAccess: false // Entra ID only: no account key, no SAS
    defaultToOAuthAuthentication: true
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      defaultAction: 'Allow'
      bypass: 'AzureServices'
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: account
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource stateTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tableService
  name: stateTableName
}

resource auditTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tableService
  name: auditTableName
}

// The core's state and audit: read and write entities of these two tables, nothing else.
resource functionUsesStateTable 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(stateTable.id, functionPrincipalId, storageTableDataContributorRoleId)
  scope: stateTable
  properties: {
    principalId: functionPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributorRoleId)
    principalType: 'ServicePrincipal'
  }
}

resource functionUsesAuditTable 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(auditTable.id, functionPrincipalId, storageTableDataContributorRoleId)
  scope: auditTable
  properties: {
    principalId: functionPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributorRoleId)
    principalType: 'ServicePrincipal'
  }
}

// The Functions host keeps its leases and keys in blobs of containers it creates itself, and
// the platform reads the deployment package with this identity: that takes the account scope.
resource functionOwnsBlobs 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account.id, functionPrincipalId, storageBlobDataOwnerRoleId)
  scope: account
  properties: {
    principalId: functionPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataOwnerRoleId)
    principalType: 'ServicePrincipal'
  }
}

output accountName string = account.name
output tableEndpoint string = account.properties.primaryEndpoints.table
output deploymentContainerUrl string = '${account.properties.primaryEndpoints.blob}${deploymentContainer.name}'
output stateTableName string = stateTable.name
output auditTableName string = auditTable.name
