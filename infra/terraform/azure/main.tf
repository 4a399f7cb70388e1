# maintenance-bridge on Azure, in one apply into one existing resource group (the same deployment
# as the Bicep in infra/azure/):
#
#   agents (VMSS) ──send──► topic maintenance-events ──subscription `functions`──► function app (Flex Consumption)
#                                    └─ subscription operator-results (command results only, for `mbridge approve`)
#   function ──send──► queue maintenance-commands (sessions: one per VM) ──receive──► agent
#   function ──► tables mbridgestate / mbridgeaudit │ drain load balancer (custom role) │ agents' /readyz
#
# Nothing authenticates with a key: Service Bus and storage refuse shared keys, Application
# Insights refuses instrumentation-key-only ingestion, and each side has its own user-assigned
# identity with roles on single entities (roles.tf).
#
# main.tf: names, identities, monitoring, storage; servicebus.tf: namespace, topic, subscriptions,
# queue; function.tf: the function app; roles.tf: the drainer role and every assignment;
# vmss_example.tf: a scale set running the agent behind an internal load balancer; diagnostics.tf:
# the diagnostic settings of the vault, the namespace and the app, and the dead-letter alert.

data "azurerm_client_config" "current" {}

data "azurerm_resource_group" "this" {
  name = var.resource_group_name
}

# A suffix that makes the globally unique names (storage account, namespace, function app) unique.
# It is drawn once and kept in the state, like Bicep's uniqueString(resourceGroup().id) is stable
# for a resource group; `terraform apply -replace=random_string.suffix` draws a new one.
resource "random_string" "suffix" {
  length  = 8
  lower   = true
  upper   = false
  numeric = true
  special = false
}

locals {
  location        = coalesce(var.location, data.azurerm_resource_group.this.location)
  subscription_id = data.azurerm_client_config.current.subscription_id
  suffix          = random_string.suffix.result

  storage_account_name = "${var.name_prefix}st${local.suffix}"
  namespace_name       = "${var.name_prefix}-sb-${local.suffix}"
  function_app_name    = "${var.name_prefix}-func-${local.suffix}"

  # The namespace's endpoint is https://<name>.servicebus.windows.net:443/ (other clouds have
  # other suffixes, which is why the host is taken from it rather than built).
  servicebus_fqdn = regex("^https://([^:/]+)", azurerm_servicebus_namespace.this.endpoint)[0]
}

# ---------------------------------------------------------------- identities

# The function app's identity: receives from its subscription, sends commands, writes its tables,
# drains the load balancer. Separate from the agents' so that a VM can never act as the function.
resource "azurerm_user_assigned_identity" "function" {
  name                = "${var.name_prefix}-func-id"
  resource_group_name = data.azurerm_resource_group.this.name
  location            = local.location
  tags                = var.tags
}

# The VMs' identity: publishes events and receives commands, nothing else.
resource "azurerm_user_assigned_identity" "agent" {
  name                = "${var.name_prefix}-agent-id"
  resource_group_name = data.azurerm_resource_group.this.name
  location            = local.location
  tags                = var.tags
}

# ---------------------------------------------------------------- monitoring

resource "azurerm_log_analytics_workspace" "this" {
  name                = "${var.name_prefix}-log-${local.suffix}"
  resource_group_name = data.azurerm_resource_group.this.name
  location            = local.location
  sku                 = "PerGB2018"
  retention_in_days   = var.log_retention_days
  tags                = var.tags
}

resource "azurerm_application_insights" "this" {
  name                = "${var.name_prefix}-appi-${local.suffix}"
  resource_group_name = data.azurerm_resource_group.this.name
  location            = local.location
  workspace_id        = azurerm_log_analytics_workspace.this.id
  application_type    = "other"
  # Telemetry is accepted only with an Entra ID token (the function identity holds Monitoring
  # Metrics Publisher on this component): the connection string alone cannot write to it.
  local_authentication_disabled = true
  tags                          = var.tags
}

# ---------------------------------------------------------------- storage

# The Functions host's storage (leases, keys), the deployment package, and the state and audit
# tables. Entra ID only: shared keys are off, so there is no account key to leak, and the
# provider manages it through Azure Resource Manager alone (providers.tf).
resource "azurerm_storage_account" "this" {
  #checkov:skip=CKV_AZURE_59:The Flex Consumption app has no virtual network integration here and reaches its storage over the public endpoint; access needs an Entra ID token and a role (shared keys are disabled)
  #checkov:skip=CKV_AZURE_35:A default-deny firewall would lock out the function app, which has no virtual network integration here; every request still needs an Entra ID token and a data role
  #checkov:skip=CKV2_AZURE_33:No private endpoint: the function app is not integrated with a virtual network in this deployment
  #checkov:skip=CKV2_AZURE_1:Microsoft-managed keys encrypt the account (with infrastructure encryption on top); the tables hold event metadata, not customer data
  #checkov:skip=CKV_AZURE_33:Queue service logging is a data-plane setting that Terraform cannot write with shared keys disabled; this account has no queues
  name                     = local.storage_account_name
  resource_group_name      = data.azurerm_resource_group.this.name
  location                 = local.location
  account_kind             = "StorageV2"
  account_tier             = "Standard"
  account_replication_type = var.storage_replication_type

  shared_access_key_enabled         = false
  default_to_oauth_authentication   = true
  min_tls_version                   = "TLS1_2"
  https_traffic_only_enabled        = true
  allow_nested_items_to_be_public   = false
  local_user_enabled                = false
  infrastructure_encryption_enabled = true
  public_network_access_enabled     = true

  # Shared keys are off, so no account SAS can be signed; this bounds any user delegation SAS.
  sas_policy {
    expiration_period = "0.01:00:00"
    expiration_action = "Log"
  }

  blob_properties {
    delete_retention_policy {
      days = 7
    }
    container_delete_retention_policy {
      days = 7
    }
  }

  tags = var.tags
}

# The Flex Consumption deployment package (function.tf: storage_container_endpoint).
resource "azurerm_storage_container" "app_package" {
  #checkov:skip=CKV2_AZURE_21:The check wants azurerm_log_analytics_storage_insights, which reads the account with its key (disabled here); blob writes and deletes go to Log Analytics through the diagnostic setting below
  name                  = "app-package"
  storage_account_id    = azurerm_storage_account.this.id
  container_access_type = "private"
}

# The state and audit tables are created through Azure Resource Manager with azapi: in azurerm 4.x
# azurerm_storage_table only takes storage_account_name and then signs its requests with the
# account key (table ACLs have no Entra ID support), which this account refuses. The ids are the
# tables' ARM ids, <account id>/tableServices/default/tables/<name>, the scope of their roles.
resource "azapi_resource" "state_table" {
  type      = "Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01"
  name      = "mbridgestate"
  parent_id = "${azurerm_storage_account.this.id}/tableServices/default"
  body = {
    properties = {}
  }
}

resource "azapi_resource" "audit_table" {
  type      = "Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01"
  name      = "mbridgeaudit"
  parent_id = "${azurerm_storage_account.this.id}/tableServices/default"
  body = {
    properties = {}
  }
}

# Who changed the deployment package or the state and audit tables, in Log Analytics. Reads are
# left out: the Functions host reads its blobs and tables constantly.
resource "azurerm_monitor_diagnostic_setting" "storage" {
  for_each = {
    blob  = "${azurerm_storage_account.this.id}/blobServices/default"
    table = "${azurerm_storage_account.this.id}/tableServices/default"
  }
  name                       = "${var.name_prefix}-${each.key}-writes"
  target_resource_id         = each.value
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  enabled_log {
    category = "StorageWrite"
  }
  enabled_log {
    category = "StorageDelete"
  }
}
