output "subscription_name" {
  description = "Name of the VM's command subscription (the agent's default --pubsub-commands-subscription)."
  value       = google_pubsub_subscription.commands.name
}

output "subscription_id" {
  description = "Full id of the VM's command subscription, projects/P/subscriptions/maintenance-commands-<vm>."
  value       = google_pubsub_subscription.commands.id
}
