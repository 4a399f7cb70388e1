# The commands entities (queues, or topics in topic mode) and the quotas that bound a deployment.
# Everything here is computed from variables alone, so tests/infra evaluates it with
# `terraform console` and no provider; the preconditions on the namespace (servicebus.tf) refuse a
# plan when a check below fails.
#
# commands_shards > 1 spreads the VMs over that many commands entities: maintenance-commands,
# maintenance-commands-1, ... The shard of a VM is the first 8 hex digits of SHA-256 of its
# lower-cased name, modulo the count: wire/shards.py computes the same for the functions and
# `mbridge approve`, `mbridge commands-entity` prints it. Change the count outside a maintenance
# wave: a command waiting in a VM's old entity is not read again (docs/deploy.md).

locals {
  # The isolated mode: each VM reads its own subscription of a commands topic, not a queue session.
  commands_via_topic = var.commands_mode == "topic"

  commands_entity_names = [
    for shard in range(var.commands_shards) : shard == 0 ? "maintenance-commands" : "maintenance-commands-${shard}"
  ]
  # Topic mode: the shard (index in commands_entity_names) of each VM given a subscription here.
  commands_subscription_shards = {
    for name, principal in var.commands_subscription_vms :
    name => parseint(substr(sha256(lower(name)), 0, 8), 16) % var.commands_shards
  }

  # Service Bus quotas, https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas:
  # subscriptions per topic; concurrent receive requests per queue, topic or subscription (a
  # topic's subscriptions count together); concurrent AMQP connections per namespace.
  servicebus_subscriptions_per_topic   = 2000
  servicebus_receives_per_entity       = 5000
  servicebus_connections_per_namespace = 5000
  # The fleet model (docs/scale.md): an agent holds a connection and a receive only while it is
  # engaged, and a region-wide freeze engages 30 % of the fleet at once. An engaged agent holds 2
  # AMQP connections (azure-servicebus opens one per sender and one per receiver).
  peak_engaged_fraction      = 0.3
  connections_per_engaged_vm = 2
  # The shard of a name is a hash: 10 % headroom over an even spread for the busiest entity.
  hash_skew_headroom = 1.1
  # The function app, at its widest: per instance, the trigger's connection and a sender per
  # commands entity.
  function_connections = var.function_maximum_instance_count * (1 + var.commands_shards)

  peak_receives_per_entity = ceil(var.fleet_size * local.peak_engaged_fraction / var.commands_shards)
  peak_connections         = ceil(var.fleet_size * local.peak_engaged_fraction * local.connections_per_engaged_vm) + local.function_connections
  vms_per_topic_with_skew  = ceil(var.fleet_size * local.hash_skew_headroom / var.commands_shards)
  subscriptions_per_topic = [
    for shard in range(var.commands_shards) :
    length([for name, vm_shard in local.commands_subscription_shards : name if vm_shard == shard])
  ]

  # Each check: ok, or the message the plan stops with.
  commands_quota_checks = {
    subscriptions_per_topic = {
      ok      = !local.commands_via_topic || max(concat([0], local.subscriptions_per_topic)...) <= local.servicebus_subscriptions_per_topic
      message = "Service Bus allows ${local.servicebus_subscriptions_per_topic} subscriptions per topic, and commands_subscription_vms puts ${max(concat([0], local.subscriptions_per_topic)...)} VMs on one commands topic: raise commands_shards (each shard is a topic of its own)."
    }
    fleet_per_topic = {
      ok      = !local.commands_via_topic || local.vms_per_topic_with_skew <= local.servicebus_subscriptions_per_topic
      message = "Service Bus allows ${local.servicebus_subscriptions_per_topic} subscriptions per topic: a fleet of ${var.fleet_size} VMs over ${var.commands_shards} commands topic(s) puts up to ${local.vms_per_topic_with_skew} VMs on one (10 % headroom for the hash's skew). Raise commands_shards to at least ${ceil(var.fleet_size * local.hash_skew_headroom / local.servicebus_subscriptions_per_topic)}."
    }
    receives_per_entity = {
      ok      = local.peak_receives_per_entity <= local.servicebus_receives_per_entity
      message = "Service Bus allows ${local.servicebus_receives_per_entity} concurrent receive requests per queue or topic (a topic's subscriptions together): ${var.fleet_size} VMs, 30 % of them engaged at the peak, over ${var.commands_shards} commands entities make ${local.peak_receives_per_entity} on one. Raise commands_shards to at least ${ceil(var.fleet_size * local.peak_engaged_fraction / local.servicebus_receives_per_entity)}."
    }
    connections_per_namespace = {
      ok      = local.peak_connections <= local.servicebus_connections_per_namespace
      message = "Service Bus allows ${local.servicebus_connections_per_namespace} concurrent AMQP connections per namespace: ${var.fleet_size} VMs, 30 % of them engaged at the peak with 2 connections each, and the function app (${local.function_connections}: function_maximum_instance_count x (1 + commands_shards)) make ${local.peak_connections}. Shards do not help: split the fleet over several deployments, each in its own resource group (its own namespace), or lower function_maximum_instance_count."
    }
  }
}
