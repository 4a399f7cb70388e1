# This file is maintained automatically by "terraform init".
# Manual edits may be lost in future updates.

provider "registry.terraform.io/azure/azapi" {
  version     = "2.13.0"
  constraints = "~> 2.0"
}

provider "registry.terraform.io/hashicorp/azurerm" {
  version     = "4.55.0"
  constraints = "~> 4.42"
}

provider "registry.terraform.io/hashicorp/random" {
  version     = "3.7.2"
  constraints = "~> 3.6"
}

provider "registry.terraform.io/hashicorp/tls" {
  version     = "4.1.0"
  constraints = "~> 4.0"
}
