# The Ed25519 key pair of signed commands (docs/commands.md): the function signs every command
# with the private key (MBRIDGE_SIGNING_KEY) and the agents execute only commands that verify
# against the public key (MBRIDGE_VERIFY_KEY); without one they refuse to start on Pub/Sub.
#
# By default the pair is generated here and the private key stored in the Secret Manager secret
# mbridge-signing-key, which the function mounts (function.tf) and its runtime account alone may
# read (iam.tf). The private key is then also kept in the Terraform state, like every value
# tls_private_key makes: keep the state where only the deployers can read it, or bring a secret
# of your own (signing_key_secret_id and verify_key), which keeps the private key out of the
# state. `terraform apply -replace=tls_private_key.commands[0]` rotates a generated pair
# (README.md, "Signing commands").

locals {
  generate_signing_key = var.signing_key_secret_id == null
}

resource "tls_private_key" "commands" {
  count = local.generate_signing_key ? 1 : 0

  algorithm = "ED25519"
}

resource "google_secret_manager_secret" "signing_key" {
  count = local.generate_signing_key ? 1 : 0

  project   = var.project_id
  secret_id = "mbridge-signing-key"

  replication {
    auto {}
  }

  depends_on = [google_project_service.apis]
}

# Unencrypted PKCS#8 PEM ("BEGIN PRIVATE KEY"), as tls writes an Ed25519 key and as
# wire/signing.py loads it. A secret mounted as an environment variable keeps its
# line breaks.
resource "google_secret_manager_secret_version" "signing_key" {
  count = local.generate_signing_key ? 1 : 0

  secret      = google_secret_manager_secret.signing_key[0].id
  secret_data = tls_private_key.commands[0].private_key_pem_pkcs8
}

locals {
  # The secret the function mounts, and the version: the generated one, or yours.
  signing_key_secret_id      = local.generate_signing_key ? google_secret_manager_secret.signing_key[0].secret_id : var.signing_key_secret_id
  signing_key_secret_version = local.generate_signing_key ? google_secret_manager_secret_version.signing_key[0].version : var.signing_key_secret_version

  # The agents' key as one line of base64 of the raw 32-byte key (an environment file holds one
  # line per variable). tls writes the public key as SubjectPublicKeyInfo PEM: for Ed25519 its
  # base64 body is MCowBQYDK2VwAyEA (the 12 DER bytes of the algorithm identifier) and then the
  # raw key, aligned on a base64 group. The regex takes that part, and fails the plan for anything
  # but an Ed25519 key.
  verify_key = local.generate_signing_key ? regex(
    "-----BEGIN PUBLIC KEY-----\\s*MCowBQYDK2VwAyEA([A-Za-z0-9+/]{43}=)\\s*-----END PUBLIC KEY-----",
    tls_private_key.commands[0].public_key_pem,
  )[0] : var.verify_key
}
