# Example fleet: VMs running the agent, in an unmanaged instance group the function drains.
#
# The startup script (infra/agent/gce-startup.sh) reads the mbridge-* metadata below, installs the
# agent with pip and starts it as a systemd service. Host-maintenance notices reach the agent
# through the metadata server; rehearse one with
#   gcloud compute instances simulate-maintenance-event VM --zone ZONE
#
# One google_compute_instance per VM, with the agent files as its own metadata, and no instance
# template: a template's metadata cannot change, so every change of an agent file would replace
# the template and re-create every VM at once. Instance metadata is updated in place (the VM keeps
# running); the startup script applies it at the next boot, or at once when re-run on the VM, one
# VM at a time (README.md, "Updating the agent"). The key is `startup-script` in `metadata`, not
# `metadata_startup_script`, which the provider applies by re-creating the VM. A managed instance
# group does not fit here: the function drains by removing VMs from unmanaged instance groups.

locals {
  agent_environment = join("", [
    "MBRIDGE_CLOUD=gce\n",
    "MBRIDGE_TRANSPORT=pubsub\n",
    "MBRIDGE_PUBSUB_PROJECT=${var.project_id}\n",
    # All interfaces: the load balancer's health checks probe /readyz from Google's ranges.
    "MBRIDGE_LISTEN=0.0.0.0:9797\n",
    # The public key of the signing key (signing.tf): only signed commands are run.
    "MBRIDGE_VERIFY_KEY=${local.verify_key}\n",
    # The audience of the VM's identity tokens: the function's MBRIDGE_TRUST_AUDIENCE.
    "MBRIDGE_IDENTITY_AUDIENCE=${local.identity_audience}\n",
  ])

  # What every example VM carries; a change is an in-place metadata update of each VM.
  agent_metadata = {
    startup-script         = file("${path.module}/../../agent/gce-startup.sh")
    mbridge-install-script = file("${path.module}/../../agent/install-agent.sh")
    mbridge-agent-unit     = file("${path.module}/../../agent/mbridge-agent.service")
    mbridge-agent-env      = local.agent_environment
    mbridge-package        = var.agent_package
    block-project-ssh-keys = "true"
    enable-oslogin         = "TRUE"
    serial-port-enable     = "false"
  }

  network_tags = var.vm_network_tags
}

resource "google_compute_instance" "vm" {
  #checkov:skip=CKV_GCP_38:example VMs whose boot disk holds only the OS and the agent; a customer-supplied key would have to be sent with every start and with every re-creation, and Google-managed encryption still applies
  for_each = toset(var.vm_names)

  name         = each.value
  zone         = var.zone
  description  = "VM running the maintenance-bridge agent"
  machine_type = var.machine_type
  tags         = local.network_tags

  boot_disk {
    auto_delete = true
    initialize_params {
      image = var.vm_image
      size  = 10
      type  = "pd-balanced"
    }
  }

  # No access_config: no external IP. PyPI and Google APIs are reached through Cloud NAT.
  network_interface {
    network    = var.network
    subnetwork = var.subnetwork
  }

  # Its own identity: the subscriber binding on maintenance-commands-<name> admits this VM only.
  service_account {
    email  = google_service_account.agent[each.value].email
    scopes = ["cloud-platform"]
  }

  shielded_instance_config {
    enable_secure_boot          = true
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  # Live migration: the VM keeps running through host maintenance; the agent reports the
  # MIGRATE_ON_HOST_MAINTENANCE notice so traffic can be drained around it.
  scheduling {
    on_host_maintenance = "MIGRATE"
    automatic_restart   = true
    preemptible         = false
  }

  metadata = local.agent_metadata

  lifecycle {
    precondition {
      condition     = var.agent_package != ""
      error_message = "agent_package is required with vm_names: <URL of mbridge-agent-pubsub-X.Y.Z.pex>#sha256=<hex> (infra/agent/README.md)."
    }
  }

  depends_on = [google_project_service.apis]
}

# The group the function drains (MBRIDGE_INSTANCE_GROUPS). Membership is one resource per VM: a
# drain in progress shows in `terraform plan` as that VM's membership to re-create, so do not
# apply during a maintenance event.
resource "google_compute_instance_group" "example" {
  name        = var.instance_group_name
  description = "Example fleet of maintenance-bridge; the function removes VMs from it during maintenance"
  zone        = var.zone
  network     = data.google_compute_network.vms.self_link
}

resource "google_compute_instance_group_membership" "example" {
  for_each = google_compute_instance.vm

  zone           = var.zone
  instance_group = google_compute_instance_group.example.name
  instance       = each.value.self_link
}

data "google_compute_network" "vms" {
  name = var.network

  depends_on = [google_project_service.apis]
}

# Load-balancer health checks come from these Google ranges; they may reach the agent's
# /healthz and /readyz port and nothing else.
resource "google_compute_firewall" "health_checks" {
  name        = "mbridge-allow-health-checks"
  description = "Google health checks to the maintenance-bridge agent (tcp:9797)"
  network     = data.google_compute_network.vms.self_link
  direction   = "INGRESS"
  priority    = 1000

  source_ranges = ["35.191.0.0/16", "130.211.0.0/22"]
  target_tags   = local.network_tags

  allow {
    protocol = "tcp"
    ports    = ["9797"]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}

# Outbound access for VMs without external IPs: pip install from PyPI, and Google APIs.
resource "google_compute_router" "nat" {
  count = var.create_cloud_nat ? 1 : 0

  name    = "mbridge-nat-router"
  region  = var.region
  network = data.google_compute_network.vms.self_link
}

resource "google_compute_router_nat" "nat" {
  count = var.create_cloud_nat ? 1 : 0

  name                               = "mbridge-nat"
  router                             = google_compute_router.nat[0].name
  region                             = var.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"

  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
}
