# The control plane's path (docs/architecture.md, "Two paths"; docs/azure.md, "The control plane's
# reports"), the same as infra/azure/modules/central-reports.bicep: Azure's own Scheduled Events of
# the subscription, raised on the Event Grid system topic of type
# Microsoft.ResourceNotifications.MaintenanceResources, delivered with the topic's own identity into
# the Service Bus queue `maintenance-central`, which the function app's `maintenance_central`
# trigger reads. The system topic's identity is the queue's only sender, the function's identity
# its only receiver (roles below). A Microsoft preview, so it all hangs on var.central_reports: the
# subscription needs the features SendScheduledEventsPolicy (Microsoft.Compute) and
# ScheduledEventsActivity (Microsoft.Maintenance) registered (docs/deploy.md).

locals {
  central_count = var.central_reports ? 1 : 0
}

# As the function's events subscription: the host renews the 5-minute lock for up to 10 minutes
# (host.json); after 10 failed invocations a message is dead-lettered, where it waits to be
# resubmitted once the cause is fixed.
resource "azurerm_servicebus_queue" "central" {
  count        = local.central_count
  name         = "maintenance-central"
  namespace_id = azurerm_servicebus_namespace.this.id

  max_delivery_count                   = 10
  lock_duration                        = "PT5M"
  default_message_ttl                  = "P14D"
  dead_lettering_on_message_expiration = true
  requires_session                     = false
}

# Azure raises the subscription's Scheduled Events here; nobody else publishes to a system topic.
# azurerm takes any non-empty topic_type and leaves the value to Azure
# (internal/services/eventgrid/eventgrid_system_topic_resource.go: validation.StringIsNotEmpty).
resource "azurerm_eventgrid_system_topic" "maintenance" {
  count                  = local.central_count
  name                   = "${var.name_prefix}-maintenance-${local.suffix}"
  resource_group_name    = data.azurerm_resource_group.this.name
  location               = "global"
  source_arm_resource_id = "/subscriptions/${local.subscription_id}"
  topic_type             = "Microsoft.ResourceNotifications.MaintenanceResources"

  identity {
    type = "SystemAssigned"
  }

  tags = var.tags
}

# ScheduledEventEmitted only, in the Event Grid schema (functions/central/event_grid.py reads both),
# delivered with the system topic's identity. Event Grid retries a failed delivery for up to a day
# (30 attempts); the queue then redelivers to the function and dead-letters what keeps failing.
resource "azurerm_eventgrid_system_topic_event_subscription" "central" {
  count               = local.central_count
  name                = "maintenance-central"
  system_topic        = azurerm_eventgrid_system_topic.maintenance[0].name
  resource_group_name = data.azurerm_resource_group.this.name

  event_delivery_schema         = "EventGridSchema"
  included_event_types          = ["Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"]
  service_bus_queue_endpoint_id = azurerm_servicebus_queue.central[0].id

  delivery_identity {
    type = "SystemAssigned"
  }

  retry_policy {
    max_delivery_attempts = 30
    event_time_to_live    = 1440
  }

  # Delivery with the identity needs its role on the queue first.
  depends_on = [azurerm_role_assignment.system_topic_sends_central]
}

# The queue's only sender: the system topic's own identity.
resource "azurerm_role_assignment" "system_topic_sends_central" {
  count                = local.central_count
  scope                = azurerm_servicebus_queue.central[0].id
  role_definition_name = "Azure Service Bus Data Sender"
  principal_id         = azurerm_eventgrid_system_topic.maintenance[0].identity[0].principal_id
  principal_type       = "ServicePrincipal"
}

# The queue trigger `maintenance_central` receives, and nothing more: these reports are few (one per
# step of a maintenance), so incremental scaling (Listen only) is enough here, unlike the events
# subscription, whose trigger holds Data Owner to scale to a wave's backlog (roles.tf).
resource "azurerm_role_assignment" "function_receives_central" {
  count                = local.central_count
  scope                = azurerm_servicebus_queue.central[0].id
  role_definition_name = "Azure Service Bus Data Receiver"
  principal_id         = azurerm_user_assigned_identity.function.principal_id
  principal_type       = "ServicePrincipal"
}
