output "events_topic_id" {
  description = "Topic the agents publish maintenance events and command results to (projects/P/topics/maintenance-events)."
  value       = google_pubsub_topic.events.id
}

output "commands_topic_id" {
  description = "Topic the function and `mbridge approve` publish commands to (projects/P/topics/maintenance-commands), shard 0's with commands_shards > 1 (commands_topics)."
  value       = google_pubsub_topic.commands[0].id
}

output "commands_topics" {
  description = "Every commands topic's name, shard 0 first: a VM's is `mbridge commands-entity --vm NAME --shards <commands_shards>`, and its subscription is on that topic."
  value       = google_pubsub_topic.commands[*].name
}

output "dead_letter_topic_id" {
  description = "Topic of events the function failed on max_delivery_attempts times; read them through dead_letter_subscription_id."
  value       = google_pubsub_topic.dead_letters.id
}

output "dead_letter_subscription_id" {
  description = "Pull subscription that keeps dead-lettered events for inspection and replay."
  value       = google_pubsub_subscription.dead_letters_inspect.id
}

output "push_subscription_id" {
  description = "Push subscription that delivers maintenance events to the function."
  value       = google_pubsub_subscription.functions.id
}

output "operator_results_subscription_id" {
  description = "Subscription of command results for `mbridge approve` (--pubsub-project with the default names finds it)."
  value       = google_pubsub_subscription.operator_results.id
}

output "function_name" {
  description = "Name of the Cloud Function (gen2); its logs are under this Cloud Run service."
  value       = google_cloudfunctions2_function.events.name
}

output "function_uri" {
  description = "URI of the function's Cloud Run service (internal ingress; push only)."
  value       = google_cloudfunctions2_function.events.service_config[0].uri
}

output "function_service_account_email" {
  description = "Runtime service account of the function."
  value       = google_service_account.function.email
}

output "build_service_account_email" {
  description = "Service account Cloud Build builds the function as (build_config.service_account); deployers need iam.serviceAccounts.actAs on it."
  value       = google_service_account.build.email
}

output "push_invoker_service_account_email" {
  description = "Service account whose OIDC token the push subscription presents to the function."
  value       = google_service_account.push_invoker.email
}

output "agent_service_account_emails" {
  description = "Service account of each example VM's agent, by VM name."
  value       = { for name, account in google_service_account.agent : name => account.email }
}

output "firestore_database_name" {
  description = "Firestore database holding state and audit (MBRIDGE_FIRESTORE_DATABASE, and `mbridge audit`)."
  value       = google_firestore_database.main.name
}

output "example_vm_names" {
  description = "Names of the example VMs running the agent."
  value       = [for vm in google_compute_instance.vm : vm.name]
}

output "instance_group" {
  description = "The example unmanaged instance group, as zone/name (an entry of MBRIDGE_INSTANCE_GROUPS)."
  value       = "${google_compute_instance_group.example.zone}/${google_compute_instance_group.example.name}"
}

output "command_subscription_names" {
  description = "Command subscription of each example VM and of each member of the example managed instance group, by VM name (maintenance-commands-<vm>)."
  value       = { for name, subscription in module.vm_commands : name => subscription.subscription_name }
}

output "agent_verify_key" {
  description = "MBRIDGE_VERIFY_KEY of every agent: the public key of the command signing key, as one line."
  value       = local.verify_key
}

output "signing_key_secret_id" {
  description = "Secret Manager secret holding the command signing key the function mounts (MBRIDGE_SIGNING_KEY)."
  value       = local.signing_key_secret_id
}

output "identity_audience" {
  description = "The audience of this deployment's identity tokens: give it to agents outside the example as MBRIDGE_IDENTITY_AUDIENCE (--identity-audience)."
  value       = local.identity_audience
}

output "mig_agent_service_account_email" {
  description = "Service account every member of the example managed instance group shares (the instance template's); null without mig_vm_names."
  value       = one(google_service_account.mig_agent[*].email)
}

output "mig_backend_service_id" {
  description = "The example group's internal passthrough backend service, health-checked on the agents' /readyz: point your forwarding rule at it. null without mig_vm_names."
  value       = one(google_compute_region_backend_service.mig[*].id)
}
