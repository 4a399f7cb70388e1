// The command signing key's Key Vault: the Ed25519 private key (MBRIDGE_SIGNING_KEY) as a secret
// that the function identity alone may read (Key Vault Secrets User on that one secret). The app
// setting holds a Key Vault reference to it, resolved by the platform with that identity
// (keyVaultReferenceIdentity, functionapp.bicep): whoever reads the app's settings sees the
// reference, not the key. Deployed unless main.bicep is given signingKeySecretUri, a secret of a
// vault of your own.

targetScope = 'resourceGroup'

@description('Key Vault name (3-24 letters, digits and hyphens, globally unique).')
@minLength(3)
@maxLength(24)
param vaultName string

@description('Azure region.')
param location string

@description('Tags for every resource.')
param tags object

@secure()
@minLength(1)
@description('The Ed25519 private key: unencrypted PKCS#8 PEM, or the raw 32-byte key as base64. Required: the agents run signed commands only.')
param signingKey string

@description('Principal (object) id of the function app\'s identity.')
param functionPrincipalId string

// Built-in role definition (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles)
var keyVaultSecretsUserRoleId = '4633458b-17de-408a-b874-0445c86b69e6'

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  // checkov:skip=CKV_AZURE_189:The function app has no VNet integration here and the platform resolves its Key Vault reference over the public endpoint; every read needs an Entra ID token and Key Vault Secrets User on the one secret.
  // checkov:skip=CKV_AZURE_109:A default-deny firewall would stop the platform resolving the app's Key Vault reference (App Service is not a trusted service for it); access is RBAC only, one role on one secret.
  // checkov:skip=CKV_AZURE_42:Soft delete keeps a deleted vault recoverable for 7 days; only purge protection is off (CKV_AZURE_110).
  // checkov:skip=CKV_AZURE_110:The key can be made again (a new pair, its public key to the agents); without purge protection a deleted vault can be purged, so redeploying into a re-created resource group, which gives the same name, is not blocked for the retention period.
  // checkov:skip=CKV2_AZURE_32:No private endpoint: the function app is not integrated with a virtual network in this deployment.
  name: vaultName
  location: location
  tags: tags
  properties: {
    tenantId: subscription().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    // Azure RBAC only: no access policies.
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 7
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      defaultAction: 'Allow'
      bypass: 'AzureServices'
    }
  }
}

resource signingKeySecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = {
  // checkov:skip=CKV_AZURE_41:No expiry: an expired secret is not resolved, and the function would stop signing commands. Rotate by deploying a new key.
  parent: vault
  name: 'commands-signing-key'
  tags: tags
  properties: {
    contentType: 'application/vnd.mbridge.ed25519-private-key'
    value: signingKey
    attributes: {
      enabled: true
    }
  }
}

resource functionReadsSigningKey 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(signingKeySecret.id, functionPrincipalId, keyVaultSecretsUserRoleId)
  scope: signingKeySecret
  properties: {
    principalId: functionPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUserRoleId)
    principalType: 'ServicePrincipal'
  }
}

@description('The vault\'s name (its diagnostic setting, modules/diagnostics.bicep).')
output vaultName string = vault.name
@description('The URI of this version of the secret. A new key is a new version, so the app setting changes and the app restarts onto it; a reference without a version would be refreshed only within 24 hours or at the next restart (https://learn.microsoft.com/azure/app-service/app-service-key-vault-references, "Rotation").')
// The function app module takes this output, so it is deployed once the role assignment exists.
output secretUriWithVersion string = signingKeySecret.properties.secretUriWithVersion
