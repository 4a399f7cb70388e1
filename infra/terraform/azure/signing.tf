# The Ed25519 key pair of signed commands (docs/commands.md): the function app signs every command
# with the private key (MBRIDGE_SIGNING_KEY) and the agents execute only commands that verify
# against the public key (MBRIDGE_VERIFY_KEY); without one they refuse to start on Service Bus.
#
# The private key is a secret in a Key Vault of its own, readable by the function identity alone
# (Key Vault Secrets User on that one secret). The app setting is a Key Vault reference, which the
# platform resolves with that identity (keyVaultReferenceIdentity, function.tf); whoever can read
# the app's settings sees the reference, not the key. The key also sits in the Terraform state,
# like every value tls_private_key makes: keep the state where only the deployers can read it.
# `terraform apply -replace=tls_private_key.commands` rotates the pair (README.md, "Signing
# commands").

resource "tls_private_key" "commands" {
  algorithm = "ED25519"
}

locals {
  # Both keys as one line of base64 of the raw 32-byte key, the form wire/signing.py
  # loads from an app setting and the agents from an environment file (a PEM block spans lines,
  # and an app setting reaches the host as an environment variable).
  #
  # tls writes the public key as SubjectPublicKeyInfo PEM: for Ed25519 its base64 body is
  # MCowBQYDK2VwAyEA (the 12 DER bytes of the algorithm identifier) and then the raw key, aligned
  # on a base64 group. The regex takes that part, and fails the plan for anything but an Ed25519
  # key.
  verify_key = regex(
    "-----BEGIN PUBLIC KEY-----\\s*MCowBQYDK2VwAyEA([A-Za-z0-9+/]{43}=)\\s*-----END PUBLIC KEY-----",
    tls_private_key.commands.public_key_pem,
  )[0]

  # The private key comes as unencrypted PKCS#8 PEM: 48 DER bytes, the 16 of the PKCS#8 and
  # algorithm framing (MC4CAQAwBQYDK2VwBCIEI...) and then the 32-byte key, not aligned on a base64
  # group. So the DER is decoded with ISO-8859-1, which maps each byte to one character, the last
  # 32 characters are taken (a regex counts characters; substr would count CR LF as one) and
  # encoded back the same way.
  signing_key_der = textdecodebase64(
    regex(
      "-----BEGIN PRIVATE KEY-----\\s*(MC4CAQAwBQYDK2VwBCIEI[A-Za-z0-9+/]{43})\\s*-----END PRIVATE KEY-----",
      tls_private_key.commands.private_key_pem_pkcs8,
    )[0],
    "ISO-8859-1",
  )
  signing_key = textencodebase64(regex("(?s)^.{16}(.{32})$", local.signing_key_der)[0], "ISO-8859-1")
}

# The vault: Azure RBAC only (no access policies), soft delete for a week. `terraform destroy`
# purges it (the provider's default), which frees the name.
resource "azurerm_key_vault" "signing" {
  #checkov:skip=CKV_AZURE_42:Soft delete keeps a deleted vault recoverable for 7 days; only purge protection is off (CKV_AZURE_110)
  #checkov:skip=CKV_AZURE_110:The key can be made again (a new pair, its public key to the agents); purge protection would forbid purging the destroyed vault, so its name stays taken for the retention period and a new apply cannot create it again
  #checkov:skip=CKV_AZURE_189:The function app has no virtual network integration here and the platform resolves its Key Vault reference over the public endpoint; every read needs an Entra ID token and Key Vault Secrets User on the one secret
  #checkov:skip=CKV_AZURE_109:A default-deny firewall would stop the platform resolving the app's Key Vault reference (App Service is not a trusted service for it); access is RBAC only, one role on one secret
  #checkov:skip=CKV2_AZURE_32:No private endpoint: the function app is not integrated with a virtual network in this deployment
  name                          = "${var.name_prefix}-kv-${local.suffix}"
  resource_group_name           = data.azurerm_resource_group.this.name
  location                      = local.location
  tenant_id                     = data.azurerm_client_config.current.tenant_id
  sku_name                      = "standard"
  rbac_authorization_enabled    = true
  purge_protection_enabled      = false
  soft_delete_retention_days    = 7
  public_network_access_enabled = true

  network_acls {
    default_action = "Allow"
    bypass         = "AzureServices"
  }

  tags = var.tags
}

# The private key as a secret, written through Resource Manager (Microsoft.KeyVault/vaults/secrets):
# the deployer needs no data-plane role on the vault and the apply does not wait for one to
# propagate. Resource Manager never returns the value, so azapi compares nothing but what it reads.
resource "azapi_resource" "signing_key" {
  type      = "Microsoft.KeyVault/vaults/secrets@2023-07-01"
  name      = "commands-signing-key"
  parent_id = azurerm_key_vault.signing.id
  body = {
    properties = {
      # The form wire/signing.py loads: the raw 32-byte key as base64, on one line.
      contentType = "application/vnd.mbridge.ed25519-private-key+base64"
      value       = local.signing_key
      # No expiry: an expired secret is not resolved, and the function would stop signing.
      attributes = { enabled = true }
    }
  }
  tags = var.tags

  response_export_values = ["properties.secretUriWithVersion"]
}

locals {
  # The app setting MBRIDGE_SIGNING_KEY: a reference to this version of the secret. A new key (a
  # new version) changes the setting, so the app restarts and signs with it at once; a reference
  # without a version would be refreshed only within a day or at the next restart.
  signing_key_reference = "@Microsoft.KeyVault(SecretUri=${azapi_resource.signing_key.output.properties.secretUriWithVersion})"
}
