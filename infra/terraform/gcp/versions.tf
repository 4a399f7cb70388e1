terraform {
  # Module for_each, variable validation and the functions used here (startswith, endswith,
  # alltrue) are all in 1.6; older releases lack some of them.
  required_version = ">= 1.6"

  required_providers {
    google = {
      source = "hashicorp/google"
      # 6.20 (February 2025) carries every argument used here: cloudfunctions2 service_config
      # (ingress, secret env vars, all_traffic_on_latest_revision), firestore delete protection,
      # PITR, deletion_policy and TTL fields, cloud_run_v2 service IAM, instance group
      # memberships, pubsub dead-letter/retry/expiration policies, provider default_labels.
      # `~>` stays within 6.x: a major release may rename or drop arguments.
      version = "~> 6.20"
    }
    google-beta = {
      source = "hashicorp/google-beta"
      # Only for google_project_service_identity (iam.tf: Pub/Sub's service agent on a fresh
      # project), which the google provider does not carry. Kept on the google provider's version.
      version = "~> 6.20"
    }
    time = {
      source = "hashicorp/time"
      # time_sleep: the functions deploy once their secret grants have had time to propagate
      # (function.tf). `~>` stays within 0.x minor releases from 0.9.
      version = "~> 0.9"
    }
    tls = {
      source = "hashicorp/tls"
      # The command signing key (signing.tf): ED25519 keys and private_key_pem_pkcs8 are in 4.0.
      version = "~> 4.0"
    }
    archive = {
      source = "hashicorp/archive"
      # archive_file's `source` blocks (content, filename) build the function's zip file by file
      # (function.tf); `~>` stays within 2.x.
      version = "~> 2.5"
    }
  }
}
