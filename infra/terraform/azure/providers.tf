provider "azurerm" {
  subscription_id = var.subscription_id

  # The storage account refuses shared keys: whatever the provider still does on the data plane
  # has to use Entra ID.
  storage_use_azuread = true

  features {
    storage {
      # Manage the storage account through Azure Resource Manager only, so that neither plan nor
      # apply needs a data-plane role or network access to the account.
      data_plane_available = false
    }
  }
}

provider "azapi" {
  subscription_id = var.subscription_id
}
