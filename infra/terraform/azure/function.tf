# The function app (Python 3.11, Flex Consumption): the Service Bus topic trigger of
# function_app.py. Deploy the code afterwards (README.md, "Apply"); the package lands in the
# app-package container, where the app reads it with its identity.

resource "azurerm_service_plan" "this" {
  #checkov:skip=CKV_AZURE_212:Flex Consumption scales per instance on demand (up to function_maximum_instance_count); a minimum worker count does not apply to the FC1 plan
  #checkov:skip=CKV_AZURE_225:Zone redundancy of a Flex Consumption plan is a regional opt-in that not every Flex region offers; the app holds no state (state and audit are in storage)
  name                = "${var.name_prefix}-plan-${local.suffix}"
  resource_group_name = data.azurerm_resource_group.this.name
  location            = local.location
  os_type             = "Linux"
  sku_name            = "FC1"
  tags                = var.tags
}

locals {
  drain_enabled            = var.drain_load_balancer_name != ""
  drain_lb_resource_group  = coalesce(var.drain_load_balancer_resource_group, data.azurerm_resource_group.this.name)
  drain_nic_resource_group = coalesce(var.drain_nic_resource_group, local.drain_lb_resource_group)
  # The resource groups of the VMs that run the agent (this one by default).
  trust_resource_groups = length(var.trust_resource_groups) > 0 ? var.trust_resource_groups : [data.azurerm_resource_group.this.name]
  # The subscriptions whose VMs may report (this one by default).
  trust_subscriptions = length(var.trust_subscriptions) > 0 ? var.trust_subscriptions : [local.subscription_id]

  # Every app setting the function reads (docs/azure.md), identity-based only: no connection
  # string with a key, no plain AzureWebJobsStorage, and no secret: the command signing key is a Key
  # Vault reference. APPLICATIONINSIGHTS_CONNECTION_STRING is set
  # through site_config (the provider moves it there), and once more in the full PUT below.
  function_app_settings = {
    # The Functions host's own storage, through the function identity.
    "AzureWebJobsStorage__accountName" = azurerm_storage_account.this.name
    "AzureWebJobsStorage__credential"  = "managedidentity"
    "AzureWebJobsStorage__clientId"    = azurerm_user_assigned_identity.function.client_id
    # Telemetry with an Entra ID token (the component refuses key-only ingestion).
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING" = "Authorization=AAD;ClientId=${azurerm_user_assigned_identity.function.client_id}"

    "MBRIDGE_EVENTS_TOPIC"        = azurerm_servicebus_topic.events.name
    "MBRIDGE_EVENTS_SUBSCRIPTION" = azurerm_servicebus_subscription.functions.name
    "MBRIDGE_COMMANDS_QUEUE"      = local.commands_via_topic ? "" : azurerm_servicebus_queue.commands[0].name
    # The isolated mode: commands onto the topic, with the property each VM's subscription filters on.
    "MBRIDGE_COMMANDS_MODE"  = var.commands_mode
    "MBRIDGE_COMMANDS_TOPIC" = local.commands_via_topic ? azurerm_servicebus_topic.commands[0].name : ""
    # Commands of a VM go to the queue or topic of its shard (commands_shards.tf).
    "MBRIDGE_COMMANDS_SHARDS" = tostring(var.commands_shards)
    # The trigger's connection `MBRIDGE_SERVICEBUS`, identity-based; the command sender reads the
    # same namespace.
    "MBRIDGE_SERVICEBUS__fullyQualifiedNamespace" = local.servicebus_fqdn
    "MBRIDGE_SERVICEBUS__credential"              = "managedidentity"
    "MBRIDGE_SERVICEBUS__clientId"                = azurerm_user_assigned_identity.function.client_id
    # DefaultAzureCredential (tables, load balancer, command sender) picks the user-assigned identity.
    "AZURE_CLIENT_ID" = azurerm_user_assigned_identity.function.client_id

    "MBRIDGE_TABLE_ENDPOINT" = azurerm_storage_account.this.primary_table_endpoint
    "MBRIDGE_STATE_TABLE"    = azapi_resource.state_table.name
    "MBRIDGE_AUDIT_TABLE"    = azapi_resource.audit_table.name

    # The load balancer to drain, all empty without one (then drains go through /readyz only).
    # Only this subscription: the drainer role is defined here.
    "MBRIDGE_LB_SUBSCRIPTION_ID"    = local.drain_enabled ? local.subscription_id : ""
    "MBRIDGE_LB_RESOURCE_GROUP"     = local.drain_enabled ? local.drain_lb_resource_group : ""
    "MBRIDGE_LB_NAME"               = var.drain_load_balancer_name
    "MBRIDGE_LB_NIC_RESOURCE_GROUP" = local.drain_enabled ? local.drain_nic_resource_group : ""
    "MBRIDGE_LB_DRAIN"              = var.drain_method
    "MBRIDGE_READINESS_DRAIN"       = var.readiness_drain ? "true" : "false"
    "MBRIDGE_POLICY"                = var.policy
    # The functions' own spans and metrics, to the Application Insights component with the
    # identity (docs/operations.md#telemetry); off: nothing of OpenTelemetry is loaded.
    "MBRIDGE_TELEMETRY" = var.telemetry
    # Notices of decisions and actions (docs/operations.md#notifications); empty: none.
    "MBRIDGE_WEBHOOK_URL"      = var.webhook_url
    "MBRIDGE_WEBHOOK_TEMPLATE" = var.webhook_template
    "MBRIDGE_WEBHOOK_ACTIONS"  = var.webhook_actions
    # Every command is signed with the generated key, read from its Key Vault secret (signing.tf);
    # the agents hold its public key.
    "MBRIDGE_SIGNING_KEY" = local.signing_key_reference
    # Who may report (policy trust: attested, the default): attested documents of VMs of these
    # subscriptions, resolved to VM names in these resource groups, where the identity holds
    # Reader (roles.tf). The roots, intermediates and signer names keep the code's defaults
    # (docs/azure.md, "Trust"); MBRIDGE_TRUST_FILE is for local runs only and never deployed.
    "MBRIDGE_TRUST_SUBSCRIPTIONS"   = join(",", local.trust_subscriptions)
    "MBRIDGE_TRUST_RESOURCE_GROUPS" = join(",", local.trust_resource_groups)
    # The control plane's reports (docs/azure.md, "The control plane's reports"): the queue the
    # Event Grid subscription delivers into (central.tf; empty: none), and Resource Graph read on a
    # timer. Both need MBRIDGE_TRUST_SUBSCRIPTIONS, set above.
    "MBRIDGE_CENTRAL_QUEUE"     = var.central_reports ? azurerm_servicebus_queue.central[0].name : ""
    "MBRIDGE_CENTRAL_RECONCILE" = var.central_reports ? "true" : "false"
  }
}

resource "azurerm_function_app_flex_consumption" "this" {
  name                = local.function_app_name
  resource_group_name = data.azurerm_resource_group.this.name
  location            = local.location
  service_plan_id     = azurerm_service_plan.this.id

  runtime_name           = "python"
  runtime_version        = "3.11"
  maximum_instance_count = var.function_maximum_instance_count
  instance_memory_in_mb  = var.function_instance_memory_mb

  # The deployment package, read with the function identity (Storage Blob Data Owner on the account).
  storage_container_type            = "blobContainer"
  storage_container_endpoint        = "${azurerm_storage_account.this.primary_blob_endpoint}${azurerm_storage_container.app_package.name}"
  storage_authentication_type       = "UserAssignedIdentity"
  storage_user_assigned_identity_id = azurerm_user_assigned_identity.function.id

  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.function.id]
  }

  https_only = true
  # The app has no HTTP triggers, but publishing goes through its SCM endpoint, which needs public
  # network access when the app is not integrated with a virtual network.
  public_network_access_enabled = true
  # Publishing authenticates with Entra ID, never with a site password.
  webdeploy_publish_basic_authentication_enabled = false

  site_config {
    application_insights_connection_string = azurerm_application_insights.this.connection_string
    minimum_tls_version                    = "1.2"
    scm_minimum_tls_version                = "1.2"
    http2_enabled                          = true
    # The app has Service Bus triggers only: refuse all inbound HTTP to it, as the Bicep does
    # (ipSecurityRestrictionsDefaultAction), and keep the SCM endpoint (deployments, Entra ID only)
    # under rules of its own.
    ip_restriction_default_action     = "Deny"
    scm_use_main_ip_restriction       = false
    scm_ip_restriction_default_action = "Allow"
  }

  app_settings = local.function_app_settings

  tags = var.tags

  # The host reads its package and takes its leases with the identity as soon as it starts.
  depends_on = [azurerm_role_assignment.function_host_storage]
}

# azurerm (4.x, provider issues #29693 and #30732) adds an app setting AzureWebJobsStorage holding
# a connection string with an EMPTY account key, whatever storage_authentication_type says. The
# Functions host prefers that plain setting to the AzureWebJobsStorage__* ones and cannot start.
# This PUT replaces the app's settings with exactly the ones above, which removes it. It runs
# again after every change the provider makes to the app (replace_triggered_by), since each
# update re-adds the setting; the provider reads the setting into storage_access_key, not into
# app_settings, so the PUT causes no drift.
resource "azapi_resource_action" "function_app_settings" {
  type        = "Microsoft.Web/sites/config@2024-04-01"
  resource_id = "${azurerm_function_app_flex_consumption.this.id}/config/appsettings"
  method      = "PUT"
  body = {
    properties = merge(local.function_app_settings, {
      "APPLICATIONINSIGHTS_CONNECTION_STRING" = azurerm_application_insights.this.connection_string
    })
  }

  # The Key Vault reference resolves on the restart this PUT causes, once the identity may read the
  # secret and is the one the app resolves references with.
  depends_on = [
    azurerm_role_assignment.function_reads_signing_key,
    azapi_resource_action.function_key_vault_identity,
  ]

  lifecycle {
    replace_triggered_by = [azurerm_function_app_flex_consumption.this]
  }
}

# Key Vault references resolve with the system-assigned identity unless the site names another in
# keyVaultReferenceIdentity, which azurerm_function_app_flex_consumption does not expose; the app
# has the user-assigned identity only. Set again after every change the provider makes to the app,
# whose full update would drop it.
resource "azapi_resource_action" "function_key_vault_identity" {
  type        = "Microsoft.Web/sites@2024-04-01"
  resource_id = azurerm_function_app_flex_consumption.this.id
  method      = "PATCH"
  body = {
    properties = {
      keyVaultReferenceIdentity = azurerm_user_assigned_identity.function.id
    }
  }

  lifecycle {
    replace_triggered_by = [azurerm_function_app_flex_consumption.this]
  }
}
