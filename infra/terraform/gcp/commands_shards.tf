# The commands topics and the quotas that bound a deployment. Everything here is computed from
# variables alone, so tests/infra evaluates it with `terraform console` and no provider; the
# preconditions on the commands topics (pubsub.tf) refuse a plan when a check below fails.
#
# commands_shards > 1 spreads the VMs over that many commands topics: maintenance-commands,
# maintenance-commands-1, ... The shard of a VM is the first 8 hex digits of SHA-256 of its
# lower-cased name, modulo the count: wire/shards.py computes the same for the functions and
# `mbridge approve`, `mbridge commands-entity` prints it. Change the count outside a maintenance
# wave: a command waiting on a VM's old subscription is not read again (docs/deploy.md).

locals {
  commands_topic_names = [
    for shard in range(var.commands_shards) : shard == 0 ? "maintenance-commands" : "maintenance-commands-${shard}"
  ]
  # Every VM given a commands subscription here: the example VMs and the named members of the
  # example managed instance group (mig_example.tf). A name in both lists is counted once here and
  # refused by the group's precondition.
  commands_vm_names = distinct(concat(var.vm_names, var.mig_vm_names))
  # The shard (index in commands_topic_names) of each VM given a commands subscription here.
  vm_commands_shards = {
    for name in local.commands_vm_names : name => parseint(substr(sha256(lower(name)), 0, 8), 16) % var.commands_shards
  }

  # Pub/Sub quotas, https://cloud.google.com/pubsub/quotas ("Resource limits"): attached
  # subscriptions per topic, and subscriptions per project (a hard limit).
  pubsub_subscriptions_per_topic   = 10000
  pubsub_subscriptions_per_project = 10000
  # The shard of a name is a hash: 10 % headroom over an even spread for the busiest topic.
  hash_skew_headroom = 1.1
  # The deployment's own subscriptions besides the VMs' (pubsub.tf): the function's push
  # subscription, the dead letters' and operator-results.
  own_subscriptions = 3

  vms_per_topic_with_skew = ceil(var.fleet_size * local.hash_skew_headroom / var.commands_shards)
  subscriptions_per_topic = [
    for shard in range(var.commands_shards) :
    length([for name, vm_shard in local.vm_commands_shards : name if vm_shard == shard])
  ]
  # Every VM of the fleet has a subscription in the project, whether created here or by a call of
  # modules/vm_commands_subscription elsewhere.
  project_subscriptions = max(var.fleet_size, length(local.commands_vm_names)) + local.own_subscriptions

  # Each check: ok, or the message the plan stops with.
  commands_quota_checks = {
    subscriptions_per_topic = {
      ok      = max(concat([0], local.subscriptions_per_topic)...) <= local.pubsub_subscriptions_per_topic
      message = "Pub/Sub allows ${local.pubsub_subscriptions_per_topic} subscriptions per topic, and vm_names with mig_vm_names put ${max(concat([0], local.subscriptions_per_topic)...)} VMs on one commands topic: raise commands_shards (each shard is a topic of its own)."
    }
    fleet_per_topic = {
      ok      = local.vms_per_topic_with_skew <= local.pubsub_subscriptions_per_topic
      message = "Pub/Sub allows ${local.pubsub_subscriptions_per_topic} subscriptions per topic: a fleet of ${var.fleet_size} VMs over ${var.commands_shards} commands topic(s) puts up to ${local.vms_per_topic_with_skew} VMs on one (10 % headroom for the hash's skew). Raise commands_shards to at least ${ceil(var.fleet_size * local.hash_skew_headroom / local.pubsub_subscriptions_per_topic)}."
    }
    subscriptions_per_project = {
      ok      = local.project_subscriptions <= local.pubsub_subscriptions_per_project
      message = "Pub/Sub allows ${local.pubsub_subscriptions_per_project} subscriptions per project, a hard limit: a fleet of ${max(var.fleet_size, length(local.commands_vm_names))} VMs, one commands subscription each, and this deployment's ${local.own_subscriptions} make ${local.project_subscriptions}. Shards do not help: split the fleet over several deployments, each in its own project."
    }
  }
}
