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

  # Service Bus Standard throttles by credits, https://learn.microsoft.com/azure/service-bus-messaging/service-bus-throttling:
  # 1,000 a second per namespace; a send or a receive costs 1 a message, and a message sent to a
  # topic 1 more for each subscription filter it is evaluated against. A region-wide freeze (30 %
  # of the fleet at once) makes, per VM, a report (send, 2 filters of the events topic's
  # subscriptions, receive: 4) and a drain and an approval command (send, receive, and in topic
  # mode one filter per VM of its topic). The model asks those of the first minute to fit in the
  # minute's credits (docs/scale.md); Premium has no credit limit.
  servicebus_credits_per_second = 1000
  credits_window_seconds        = 60
  credits_per_report            = 4
  filters_per_command           = local.commands_via_topic ? local.vms_per_topic_with_skew : 0
  peak_freeze_vms               = ceil(var.fleet_size * local.peak_engaged_fraction)
  peak_freeze_credits           = local.peak_freeze_vms * (local.credits_per_report + 2 * (2 + local.filters_per_command))
  # The most subscriptions a commands topic may carry for the freeze's credits to fit (below 1: none do).
  credits_filters_allowed = floor((local.servicebus_credits_per_second * local.credits_window_seconds / local.peak_freeze_vms - local.credits_per_report) / 2 - 2)
  credits_shards_needed   = local.credits_filters_allowed >= 1 ? ceil(var.fleet_size * local.hash_skew_headroom / local.credits_filters_allowed) : 0

  # Microsoft.Network throttles writes per subscription and region: "write / delete (PUT)", 1000 per
  # 5 minutes (https://learn.microsoft.com/azure/azure-resource-manager/management/request-limits-and-throttling).
  # Draining through the load balancer's pools is one NIC PUT per VM: a freeze's drains must fit the
  # 14 minutes an approval has (docs/policy.md), 2,800 PUTs, shared with every deployment and
  # anything else writing network resources in the subscription.
  network_puts_per_window = 1000
  network_window_seconds  = 300
  drain_deadline_seconds  = 840
  drains_through_pools    = var.drain_load_balancer_name != ""
  network_puts_allowed    = floor(local.network_puts_per_window * local.drain_deadline_seconds / local.network_window_seconds)

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
    isolation = {
      ok      = local.commands_via_topic || length(var.commands_subscription_vms) == 0
      message = "commands_subscription_vms gives ${length(var.commands_subscription_vms)} VMs identities of their own, and the queue mode would let each of them read or take the others' commands: set commands_mode = \"topic\" to give each its own subscription (docs/security.md), or leave commands_subscription_vms empty for the queue mode."
    }
    servicebus_credits = {
      ok      = var.servicebus_sku != "Standard" || local.peak_freeze_credits <= local.servicebus_credits_per_second * local.credits_window_seconds
      message = "Service Bus Standard allows ${local.servicebus_credits_per_second} credits a second per namespace, and a message sent to a topic costs one more per subscription filter: a freeze of 30 % of ${var.fleet_size} VMs needs ${local.peak_freeze_credits} credits for its reports, drains and approvals, more than a minute's ${local.servicebus_credits_per_second * local.credits_window_seconds}. ${local.credits_shards_needed > 0 ? "Raise commands_shards to at least ${local.credits_shards_needed} (fewer VMs per commands topic), or use" : "Use"} servicebus_sku = \"Premium\" (no credit limit)."
    }
    network_writes = {
      ok      = !local.drains_through_pools || local.peak_freeze_vms <= local.network_puts_allowed
      message = "Azure Resource Manager allows ${local.network_puts_per_window} network writes (PUT) per ${local.network_window_seconds} s per subscription and region, and draining through the pools of ${var.drain_load_balancer_name} is one NIC PUT per VM: a freeze of 30 % of ${var.fleet_size} VMs makes ${local.peak_freeze_vms} drains, more than the ${local.network_puts_allowed} that fit the 14 minutes an approval has. Drain through /readyz instead (drain_load_balancer_name = \"\", the load balancer's probe on /readyz), or spread the fleet over subscriptions."
    }
    connections_per_namespace = {
      ok      = local.peak_connections <= local.servicebus_connections_per_namespace
      message = "Service Bus allows ${local.servicebus_connections_per_namespace} concurrent AMQP connections per namespace: ${var.fleet_size} VMs, 30 % of them engaged at the peak with 2 connections each, and the function app (${local.function_connections}: function_maximum_instance_count x (1 + commands_shards)) make ${local.peak_connections}. Shards do not help: split the fleet over several deployments, each in its own resource group (its own namespace), or lower function_maximum_instance_count."
    }
  }
}
