terraform {
  required_version = ">= 1.6"

  required_providers {
    azurerm = {
      source  = "hashicorp/azurerm"
      version = "~> 4.42"
    }
    azapi = {
      source = "Azure/azapi"
      # Deleting the subscription's `$Default` rule (azurerm cannot).
      version = "~> 2.0"
    }
  }
}
