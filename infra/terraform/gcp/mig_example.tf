# Example fleet, opt-in (mig_vm_names; empty by default, and then nothing here is made): a zonal
# managed instance group of VMs running the agent, behind an internal passthrough load balancer's
# backend service, drained through the agent's /readyz.
#
# A managed group's members cannot be drained by taking them out of an unmanaged instance group, as
# the function drains the example VMs of vm_example.tf: the group owns its members. They are drained
# through the agent instead: on a drain command it turns /readyz unready, the backend service's
# health check sees it and sends new connections elsewhere (MBRIDGE_READINESS_DRAIN, required
# here). What must never happen is the group autohealing on that same check: it would delete and
# recreate every VM drained for its maintenance. So there are two checks (mig_health_checks.tf):
# the backend service's on /readyz, the group's on the agent's /healthz (or the application's
# liveness), and the plan refuses any other wiring. The functions check it again before each drain.
#
# Members by name. The agent pulls its commands from maintenance-commands-<its VM name>, so every
# member needs a known name with a subscription made for it. Each member is made by name from the
# template (google_compute_per_instance_config: the group's createInstances), and its subscription
# by the module of pubsub.tf, counted by the quota checks of commands_shards.tf. The group has no
# target_size and must get no autoscaler: a member made by a resize gets a random name and no
# subscription, so its drain commands would never be read and its maintenance go undrained.
#
# One identity for all. A template names one service account, so the members share it
# (google_service_account.mig_agent, iam.tf): each member's subscription admits every member. The
# example VMs of vm_example.tf have an account each and cannot read one another's commands; members
# of this group can. docs/gcp.md#autohealers weighs what that opens.
#
# The agent in a template. A template cannot change: an agent change (a file of infra/agent/,
# agent_package, its environment) makes a new template, and the group's update policy replaces the
# members with it one at a time, keeping their names.

resource "google_compute_instance_template" "mig" {
  count = local.mig_enabled ? 1 : 0

  # A new name each time the agent changes: the new template is made before the group moves to it
  # and the old one is deleted after.
  name_prefix  = "${var.mig_name}-"
  description  = "Members of ${var.mig_name} running the maintenance-bridge agent"
  machine_type = var.machine_type
  # The health-check firewall rule (vm_example.tf) targets these tags.
  tags = local.network_tags

  disk {
    boot         = true
    auto_delete  = true
    source_image = var.vm_image
    disk_size_gb = 10
    disk_type    = "pd-balanced"
  }

  # No access_config: no external IP. PyPI and Google APIs are reached through Cloud NAT.
  network_interface {
    network    = var.network
    subnetwork = var.subnetwork
  }

  service_account {
    email  = google_service_account.mig_agent[0].email
    scopes = ["cloud-platform"]
  }

  shielded_instance_config {
    enable_secure_boot          = true
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  # Live migration, as for the example VMs: the agent reports the notice so traffic can be drained.
  scheduling {
    on_host_maintenance = "MIGRATE"
    automatic_restart   = true
    preemptible         = false
  }

  metadata = local.agent_metadata

  lifecycle {
    create_before_destroy = true

    precondition {
      condition     = var.agent_package != ""
      error_message = "agent_package is required with mig_vm_names: <URL of mbridge-agent-pubsub-X.Y.Z.pex>#sha256=<hex> (infra/agent/README.md)."
    }
  }

  depends_on = [google_project_service.apis]
}

resource "google_compute_health_check" "mig" {
  for_each = local.mig_enabled ? local.mig_health_checks : {}

  name                = each.value.name
  description         = each.value.description
  check_interval_sec  = each.value.check_interval_sec
  timeout_sec         = each.value.timeout_sec
  healthy_threshold   = each.value.healthy_threshold
  unhealthy_threshold = each.value.unhealthy_threshold

  http_health_check {
    request_path = each.value.request_path
    port         = each.value.port
  }

  # Each change of a member's health is logged: a drain shows as its readiness going unhealthy.
  log_config {
    enable = true
  }

  depends_on = [google_project_service.apis]
}

resource "google_compute_instance_group_manager" "mig" {
  count = local.mig_enabled ? 1 : 0

  name               = var.mig_name
  description        = "Example managed instance group of maintenance-bridge; drained through the agents' /readyz"
  zone               = var.zone
  base_instance_name = var.mig_name
  # No target_size: the members are the per-instance configs below, each of which adds one. A
  # target_size would have the group make members of its own, with random names and no commands
  # subscription.

  version {
    name              = "agent"
    instance_template = google_compute_instance_template.mig[0].id
  }

  auto_healing_policies {
    health_check = google_compute_health_check.mig[local.mig_autohealing_check_key].id
    # A new member boots, downloads and installs the agent (startup script) before /healthz
    # answers; it is not repaired before then.
    initial_delay_sec = 300
  }

  # An agent change replaces the members one at a time: RECREATE keeps each member's name (and so
  # its commands subscription), which rules out surge members; the next member is replaced once the
  # last one passes the autohealing check. Outside a maintenance wave: a member being replaced
  # cannot be drained.
  update_policy {
    type                           = "PROACTIVE"
    minimal_action                 = "REPLACE"
    most_disruptive_allowed_action = "REPLACE"
    replacement_method             = "RECREATE"
    max_surge_fixed                = 0
    max_unavailable_fixed          = 1
  }

  lifecycle {
    # The rule of the two checks (mig_health_checks.tf).
    precondition {
      condition     = length(local.mig_health_check_conflicts) == 0
      error_message = join(" ", local.mig_health_check_conflicts)
    }
    precondition {
      condition     = var.readiness_drain
      error_message = "mig_vm_names needs readiness_drain = true: the group's members are drained through the agent's /readyz only."
    }
    # A name in both lists would be one subscription for two VMs (commands_shards.tf).
    precondition {
      condition     = length(setintersection(var.vm_names, var.mig_vm_names)) == 0
      error_message = "vm_names and mig_vm_names share ${join(", ", setintersection(var.vm_names, var.mig_vm_names))}: a VM name has one commands subscription, so it names one VM."
    }
    # The function acts only on reports of VMs of the trusted projects and zones.
    precondition {
      condition     = contains(local.trust_projects, var.project_id) && (length(var.trust_zones) == 0 || contains(var.trust_zones, var.zone))
      error_message = "The group's members are in ${var.project_id}, zone ${var.zone}: add them to trust_projects and trust_zones, or the function acts on none of their reports."
    }
  }
}

# Each member, made by name. Taking a name out of mig_vm_names deletes that member (and its
# commands subscription, pubsub.tf).
resource "google_compute_per_instance_config" "mig" {
  for_each = toset(var.mig_vm_names)

  zone                       = var.zone
  instance_group_manager     = google_compute_instance_group_manager.mig[0].name
  name                       = each.value
  remove_instance_on_destroy = true
}

# The backend service of an internal passthrough load balancer, the least surprising one to show the
# rule with. It forwards packets without terminating connections, so the backend service's health
# check alone decides where new connections go, and TCP connections already open stay on a backend
# that turns unhealthy (its default connection tracking): a drain stops new connections only, and
# the drain period gives the open ones time. It is internal (no public address) and regional, like
# the zonal group, and its health check probes a port of its own (the agent's), whatever ports the
# application serves. The forwarding rule, for the application's ports, is the deployment's own: the
# example members run no application.
resource "google_compute_region_backend_service" "mig" {
  count = local.mig_enabled ? 1 : 0

  name                  = var.mig_name
  description           = "Internal passthrough backend service of ${var.mig_name}; its health check is the agents' /readyz"
  region                = var.region
  load_balancing_scheme = "INTERNAL"
  protocol              = "TCP"
  network               = data.google_compute_network.vms.self_link
  health_checks         = [google_compute_health_check.mig[local.mig_backend_check_key].id]

  backend {
    group          = google_compute_instance_group_manager.mig[0].instance_group
    balancing_mode = "CONNECTION"
  }
}
