# The example (var.deploy_example_scale_set): a Uniform Linux scale set running the agent, in a new
# virtual network, behind a new internal Standard load balancer whose health probe asks the
# agent's /readyz. A `drain` command turns /readyz unready and the load balancer stops sending the
# VM new connections; `restore` brings it back (docs/azure.md, "Draining through the agent's
# readiness"). A scale-in or delete raises a Terminate event that waits up to
# terminate_not_before_timeout for the agent's approval.

locals {
  # Queue mode only: the scale set's VMs share one identity, which the topic mode cannot isolate.
  example_count = var.deploy_example_scale_set && !local.commands_via_topic ? 1 : 0

  # The agent's environment file (/etc/mbridge/agent.env), one KEY=value per line. Also an output,
  # for agents on VMs outside the example.
  agent_environment = {
    MBRIDGE_CLOUD                = "azure"
    MBRIDGE_TRANSPORT            = "servicebus"
    MBRIDGE_SERVICEBUS_NAMESPACE = local.servicebus_fqdn
    AZURE_CLIENT_ID              = azurerm_user_assigned_identity.agent.client_id
    MBRIDGE_LISTEN               = "0.0.0.0:9797"
    # The public key of the generated signing key (signing.tf): only signed commands are run.
    MBRIDGE_VERIFY_KEY = local.verify_key
    # Each agent derives its own commands queue from its VM's name and the count (wire/shards.py).
    MBRIDGE_COMMANDS_SHARDS = tostring(var.commands_shards)
  }
  agent_environment_file = join("", [for name, value in local.agent_environment : "${name}=${value}\n"])

  # infra/agent/cloud-init.yaml with its placeholders filled: each carries a whole file as base64,
  # so no YAML quoting can break it.
  agent_cloud_init = replace(replace(replace(replace(
    file("${path.module}/../../agent/cloud-init.yaml"),
    "@@AGENT_ENV_B64@@", base64encode(local.agent_environment_file)),
    "@@AGENT_UNIT_B64@@", filebase64("${path.module}/../../agent/mbridge-agent.service")),
    "@@INSTALL_SCRIPT_B64@@", filebase64("${path.module}/../../agent/install-agent.sh")),
  "@@INSTALL_ENV_B64@@", base64encode("MBRIDGE_PACKAGE=${var.agent_package}\n"))
}

# ---------------------------------------------------------------- network

resource "azurerm_virtual_network" "example" {
  count               = local.example_count
  name                = "${var.name_prefix}-vnet"
  resource_group_name = data.azurerm_resource_group.this.name
  location            = local.location
  address_space       = [var.example_vnet_cidr]
  tags                = var.tags
}

resource "azurerm_subnet" "agents" {
  count                = local.example_count
  name                 = "agents"
  resource_group_name  = data.azurerm_resource_group.this.name
  virtual_network_name = azurerm_virtual_network.example[0].name
  address_prefixes     = [cidrsubnet(var.example_vnet_cidr, 24 - tonumber(split("/", var.example_vnet_cidr)[1]), 0)]
  # No implicit outbound address: the VMs go out through the NAT gateway below, nothing else.
  default_outbound_access_enabled = false
}

resource "azurerm_network_security_group" "agents" {
  count               = local.example_count
  name                = "${var.name_prefix}-agents-nsg"
  resource_group_name = data.azurerm_resource_group.this.name
  location            = local.location

  # The load balancer's health probe (source tag AzureLoadBalancer) reaches the agent's /readyz
  # on 9797, and no other port: the default AllowAzureLoadBalancerInBound rule (65001) would let
  # it reach every port.
  security_rule {
    name                       = "allow-lb-probe-agent"
    priority                   = 100
    direction                  = "Inbound"
    access                     = "Allow"
    protocol                   = "Tcp"
    source_address_prefix      = "AzureLoadBalancer"
    source_port_range          = "*"
    destination_address_prefix = "*"
    destination_port_range     = "9797"
  }

  security_rule {
    name                       = "deny-lb-other-ports"
    priority                   = 110
    direction                  = "Inbound"
    access                     = "Deny"
    protocol                   = "*"
    source_address_prefix      = "AzureLoadBalancer"
    source_port_range          = "*"
    destination_address_prefix = "*"
    destination_port_range     = "*"
  }

  # The balanced service itself, for clients in the virtual network (the load balancer is
  # internal and keeps the client's address). The internet reaches nothing: DenyAllInBound.
  security_rule {
    name                       = "allow-http-from-vnet"
    priority                   = 200
    direction                  = "Inbound"
    access                     = "Allow"
    protocol                   = "Tcp"
    source_address_prefix      = "VirtualNetwork"
    source_port_range          = "*"
    destination_address_prefix = "*"
    destination_port_range     = "80"
  }

  tags = var.tags
}

resource "azurerm_subnet_network_security_group_association" "agents" {
  count                     = local.example_count
  subnet_id                 = azurerm_subnet.agents[0].id
  network_security_group_id = azurerm_network_security_group.agents[0].id
}

# Outbound only, for the VMs without public IPs: the installer's pip, Service Bus, Entra ID. A VM
# in the backend pool of an internal Standard load balancer has no other way out.
resource "azurerm_public_ip" "nat" {
  count               = local.example_count
  name                = "${var.name_prefix}-nat-ip"
  resource_group_name = data.azurerm_resource_group.this.name
  location            = local.location
  allocation_method   = "Static"
  sku                 = "Standard"
  tags                = var.tags
}

resource "azurerm_nat_gateway" "agents" {
  count               = local.example_count
  name                = "${var.name_prefix}-nat"
  resource_group_name = data.azurerm_resource_group.this.name
  location            = local.location
  sku_name            = "Standard"
  tags                = var.tags
}

resource "azurerm_nat_gateway_public_ip_association" "agents" {
  count                = local.example_count
  nat_gateway_id       = azurerm_nat_gateway.agents[0].id
  public_ip_address_id = azurerm_public_ip.nat[0].id
}

resource "azurerm_subnet_nat_gateway_association" "agents" {
  count          = local.example_count
  subnet_id      = azurerm_subnet.agents[0].id
  nat_gateway_id = azurerm_nat_gateway.agents[0].id
}

# ---------------------------------------------------------------- internal load balancer

resource "azurerm_lb" "agents" {
  count               = local.example_count
  name                = "${var.name_prefix}-agents-lb"
  resource_group_name = data.azurerm_resource_group.this.name
  location            = local.location
  sku                 = "Standard"

  frontend_ip_configuration {
    name                          = "internal"
    subnet_id                     = azurerm_subnet.agents[0].id
    private_ip_address_allocation = "Dynamic"
  }

  tags = var.tags
}

resource "azurerm_lb_backend_address_pool" "agents" {
  count           = local.example_count
  name            = "agents"
  loadbalancer_id = azurerm_lb.agents[0].id
}

# The agent's readiness: unready while drained (or, without a command channel, while an impactful
# event for the VM is pending), so the load balancer takes the VM out on its own.
resource "azurerm_lb_probe" "readyz" {
  count               = local.example_count
  name                = "agent-readyz"
  loadbalancer_id     = azurerm_lb.agents[0].id
  protocol            = "Http"
  port                = 9797
  request_path        = "/readyz"
  interval_in_seconds = 5
  # Two failed probes take a VM out, as in the Bicep (probeThreshold 2).
  probe_threshold = 2
}

resource "azurerm_lb_rule" "http" {
  count                          = local.example_count
  name                           = "http"
  loadbalancer_id                = azurerm_lb.agents[0].id
  protocol                       = "Tcp"
  frontend_port                  = 80
  backend_port                   = 80
  frontend_ip_configuration_name = azurerm_lb.agents[0].frontend_ip_configuration[0].name
  backend_address_pool_ids       = [azurerm_lb_backend_address_pool.agents[0].id]
  probe_id                       = azurerm_lb_probe.readyz[0].id
  # Outbound goes through the NAT gateway.
  disable_outbound_snat = true
}

# ---------------------------------------------------------------- the scale set

resource "azurerm_linux_virtual_machine_scale_set" "agents" {
  #checkov:skip=CKV_AZURE_178:The SSH key comes from var.admin_ssh_public_key, which a precondition requires when the example is deployed; its default is empty only so that deployments without the example need none
  #checkov:skip=CKV_AZURE_97:Encryption at host needs the EncryptionAtHost feature registered on the subscription; the example VMs keep no data beyond the agent's outbox
  count               = local.example_count
  name                = "${var.name_prefix}-agents"
  resource_group_name = data.azurerm_resource_group.this.name
  location            = local.location
  sku                 = var.scale_set_sku
  instances           = var.scale_set_instances

  admin_username                  = var.admin_username
  disable_password_authentication = true
  admin_ssh_key {
    username   = var.admin_username
    public_key = var.admin_ssh_public_key
  }

  source_image_reference {
    publisher = "Canonical"
    offer     = "0001-com-ubuntu-server-jammy"
    sku       = "22_04-lts-gen2"
    version   = "latest"
  }

  os_disk {
    caching              = "ReadWrite"
    storage_account_type = "StandardSSD_LRS"
  }

  secure_boot_enabled = true
  vtpm_enabled        = true

  # The agents' identity: AZURE_CLIENT_ID in their environment file names it.
  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.agent.id]
  }

  network_interface {
    name    = "agent"
    primary = true

    ip_configuration {
      name                                   = "internal"
      primary                                = true
      subnet_id                              = azurerm_subnet.agents[0].id
      load_balancer_backend_address_pool_ids = [azurerm_lb_backend_address_pool.agents[0].id]
    }
  }

  # Installs the agent on first boot (infra/agent/cloud-init.yaml and the files it carries).
  custom_data = base64encode(local.agent_cloud_init)

  # Scheduled Events Terminate notifications: a scale-in or delete waits for the agent's approval,
  # at most this long.
  termination_notification {
    enabled = true
    timeout = var.terminate_not_before_timeout
  }

  # Extra VMs would boot, run the agent and publish events only to be deleted again.
  overprovision = false

  # A model change (custom_data: a new agent package, a new verify key) rolls like the Bicep's:
  # Azure upgrades the instances in batches of half the set, a minute apart, each batch waiting
  # for the load balancer's probe (/readyz) before the next, and stops when too many stay
  # unhealthy. With upgrade_mode "Manual", azurerm itself updates and reimages every instance back
  # to back during the apply, with no health gating (upgradeInstancesForManualUpgradePolicy in the
  # provider's virtual_machine_scale_set_update.go; in "Rolling" mode it leaves the roll to Azure).
  upgrade_mode    = "Rolling"
  health_probe_id = azurerm_lb_probe.readyz[0].id
  rolling_upgrade_policy {
    max_batch_instance_percent              = 50
    max_unhealthy_instance_percent          = 50
    max_unhealthy_upgraded_instance_percent = 50
    pause_time_between_batches              = "PT1M"
  }
  # OS image upgrades go the same way, as in the Bicep.
  automatic_os_upgrade_policy {
    enable_automatic_os_upgrade = true
    disable_automatic_rollback  = false
  }
  # No automatic instance repairs on the /readyz probe: a drained VM is unready on purpose and
  # must not be replaced for it.

  boot_diagnostics {}

  tags = var.tags

  lifecycle {
    precondition {
      condition     = var.admin_ssh_public_key != ""
      error_message = "admin_ssh_public_key is required when deploy_example_scale_set is true (the VMs take SSH keys only)."
    }
    precondition {
      condition     = var.agent_package != ""
      error_message = "agent_package is required when deploy_example_scale_set is true: <URL of mbridge-agent-servicebus-X.Y.Z.pex>#sha256=<hex> (infra/agent/README.md)."
    }
  }

  # The agents check their Service Bus rights when they start, and pip needs the way out. A rolling
  # upgrade policy needs its health probe in use by a load balancing rule.
  depends_on = [
    azurerm_lb_rule.http,
    azurerm_role_assignment.agent_sends_events,
    azurerm_role_assignment.agent_receives_commands,
    azurerm_subnet_nat_gateway_association.agents,
    azurerm_subnet_network_security_group_association.agents,
  ]
}

# The control plane's path (central.tf): every VM's Scheduled Events also go to the subscription's
# Event Grid system topic and to Resource Graph (maintenanceresources). azurerm has no argument for
# the scale set's scheduledEventsPolicy, which needs the Compute API 2025-04-01 or later, so it is
# written through Resource Manager; the whole scale set shares one policy, and during the preview the
# only schema version is 2020-07-01 (Microsoft's "Scheduled Events in Event Grid" page). Written
# again whenever the provider replaces the scale set.
resource "azapi_update_resource" "agents_scheduled_events_policy" {
  count       = local.example_count
  type        = "Microsoft.Compute/virtualMachineScaleSets@2025-04-01"
  resource_id = azurerm_linux_virtual_machine_scale_set.agents[0].id
  body = {
    properties = {
      scheduledEventsPolicy = {
        scheduledEventsAdditionalPublishingTargets = {
          eventGridAndResourceGraph = {
            enable                    = var.central_reports
            scheduledEventsApiVersion = "2020-07-01"
          }
        }
      }
    }
  }

  lifecycle {
    replace_triggered_by = [azurerm_linux_virtual_machine_scale_set.agents]
  }
}
