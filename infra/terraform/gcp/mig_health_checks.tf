# The switch of the example managed instance group (mig_example.tf), its health checks and the rule
# they keep (docs/gcp.md#autohealers). The backend service probes the agent's /readyz, which a drain
# turns unready on purpose; the group autoheals on another check, never on that one, or every
# drained VM would be deleted and recreated. The functions refuse such a drain when they meet it
# (functions/gcp_app/autohealer.py); the group's precondition refuses the plan first.
#
# Everything here is computed from variables alone, so tests/infra evaluates it with `terraform
# console` and no provider, and puts the checks through the functions' own decision.

locals {
  # Nothing of the example group is made without members.
  mig_enabled = length(var.mig_vm_names) > 0

  # The agent's health server: MBRIDGE_LISTEN of the example VMs (vm_example.tf), the port the
  # functions expect it on (MBRIDGE_AGENT_HEALTH_PORT's default), and its readiness path.
  agent_health_port    = 9797
  agent_readiness_path = "/readyz"

  mig_health_checks = {
    # The backend service's. A drained VM fails it check_interval_sec x unhealthy_threshold (10 s)
    # after the agent turned unready, well within the policy's readiness_probe_seconds (30 s by
    # default, docs/policy.md#probe-aware-drains), from which the drain period is counted.
    readiness = {
      name                = "${var.mig_name}-readiness"
      description         = "The agent's readiness on ${var.mig_name}'s members: unready while drained for maintenance. The backend service's check, never autohealing's."
      request_path        = local.agent_readiness_path
      port                = local.agent_health_port
      check_interval_sec  = 5
      timeout_sec         = 5
      healthy_threshold   = 2
      unhealthy_threshold = 2
    }
    # The group's autohealing: the agent alive (its /healthz fails only when its own loops die), or
    # the application's liveness (mig_autohealing_check). Slower to give up on a VM than the
    # readiness check, as a repair deletes and recreates it.
    autohealing = {
      name                = "${var.mig_name}-autohealing"
      description         = "Liveness of ${var.mig_name}'s members, which the group repairs on. Never the agent's /readyz: a drain turns it unready on purpose."
      request_path        = var.mig_autohealing_check.request_path
      port                = var.mig_autohealing_check.port
      check_interval_sec  = 10
      timeout_sec         = 5
      healthy_threshold   = 2
      unhealthy_threshold = 3
    }
  }

  # Which check serves which purpose: mig_example.tf names the checks through these keys only.
  mig_backend_check_key     = "readiness"
  mig_autohealing_check_key = "autohealing"

  mig_backend_health_check     = local.mig_health_checks[local.mig_backend_check_key]
  mig_autohealing_health_check = local.mig_health_checks[local.mig_autohealing_check_key]

  # What the plan refuses, one sentence each; the group's precondition stops on any of them. A check
  # probes the agent's readiness as the functions decide it (autohealer.conflicting): its path,
  # without the query, is the readiness path, on the agent's health port.
  mig_autohealing_probes_readiness = (
    split("?", local.mig_autohealing_health_check.request_path)[0] == local.agent_readiness_path &&
    local.mig_autohealing_health_check.port == local.agent_health_port
  )
  mig_backend_probes_readiness = (
    split("?", local.mig_backend_health_check.request_path)[0] == local.agent_readiness_path &&
    local.mig_backend_health_check.port == local.agent_health_port
  )
  mig_health_check_conflicts = compact([
    local.mig_autohealing_check_key == local.mig_backend_check_key ? "The group autoheals on the backend service's health check (${local.mig_backend_health_check.name}), which a drain turns unready: every drained VM would be recreated. Give autohealing a check of its own." : "",
    local.mig_autohealing_probes_readiness ? "mig_autohealing_check probes the agent's readiness (${local.agent_readiness_path} on port ${local.agent_health_port}), which a drain turns unready: every drained VM would be recreated. Autohealing takes the agent's /healthz or the application's own liveness (docs/gcp.md#autohealers)." : "",
    local.mig_backend_probes_readiness ? "" : "The backend service's health check must probe the agent's readiness (${local.agent_readiness_path} on port ${local.agent_health_port}): a drain through /readyz would not take a VM out of the load balancer.",
  ])
}
