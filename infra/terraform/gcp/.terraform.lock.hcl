# This file is maintained automatically by "terraform init".
# Manual edits may be lost in future updates.

provider "registry.terraform.io/hashicorp/archive" {
  version     = "2.7.1"
  constraints = "~> 2.5"
}

provider "registry.terraform.io/hashicorp/google" {
  version     = "6.50.0"
  constraints = "~> 6.20"
}

provider "registry.terraform.io/hashicorp/google-beta" {
  version     = "6.50.0"
  constraints = "~> 6.20"
}

provider "registry.terraform.io/hashicorp/time" {
  version     = "0.13.1"
  constraints = "~> 0.9"
}

provider "registry.terraform.io/hashicorp/tls" {
  version     = "4.1.0"
  constraints = "~> 4.0"
}
