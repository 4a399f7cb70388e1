terraform {
  # Variable validation, lifecycle preconditions, replace_triggered_by and the functions used here
  # (coalesce, distinct, regex, filebase64, textdecodebase64) are all in 1.6.
  required_version = ">= 1.6"

  required_providers {
    azurerm = {
      source = "hashicorp/azurerm"
      # The newest argument used here is azurerm_key_vault's rbac_authorization_enabled (signing.tf),
      # added in 4.42.0 as the new name of enable_rbac_authorization (CHANGELOG-v4.md, 4.42.0):
      # a plan with 4.31 to 4.41 fails on it. 4.42 also carries the rest:
      # azurerm_function_app_flex_consumption (4.21.0) and its https_only (4.31.0, #29024), the
      # storage data_plane_available feature, storage_account_id on containers, subnet
      # default_outbound_access_enabled. `~>` stays within 4.x: 5.0 renames and removes arguments.
      # .terraform.lock.hcl selects the release the offline validation checks against.
      version = "~> 4.42"
    }
    azapi = {
      source = "Azure/azapi"
      # What azurerm 4.x cannot do without shared keys or without breaking the app (main.tf,
      # servicebus.tf, function.tf): tables through ARM, removing a subscription's $Default rule,
      # replacing the function app's settings. 2.0 takes `body` as an HCL object.
      version = "~> 2.0"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.6"
    }
    tls = {
      source = "hashicorp/tls"
      # The command signing key (signing.tf): ED25519 keys and private_key_pem_pkcs8 are in 4.0.
      version = "~> 4.0"
    }
  }
}
