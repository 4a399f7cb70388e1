# The Ed25519 key pair of signed commands (docs/commands.md): the function app signs every command
# with the private key (MBRIDGE_SIGNING_KEY) and the agents execute only commands that verify
# against the public key (MBRIDGE_VERIFY_KEY); without one they refuse to start on Service Bus.
#
# The private key is kept in the Terraform state, like every value tls_private_key makes, and in
# the function app's settings, which Azure encrypts at rest and shows only to principals allowed
# Microsoft.Web/sites/config/list/action (Owner, Contributor, Website Contributor). Keep the
# state where only the deployers can read it. `terraform apply -replace=tls_private_key.commands`
# rotates the pair (README.md, "Signing commands").

resource "tls_private_key" "commands" {
  algorithm = "ED25519"
}

locals {
  # Both keys as one line of base64 of the raw 32-byte key, the form wire/signing.py
  # loads from an app setting and the agents from an environment file (a PEM block spans lines,
  # and an app setting reaches the host as an environment variable).
  #
  # tls writes the public key as SubjectPublicKeyInfo PEM: for Ed25519 its base64 body is
  # MCowBQYDK2VwAyEA (the 12 DER bytes of the algorithm identifier) and then the raw key, aligned
  # on a base64 group. The regex takes that part, and fails the plan for anything but an Ed25519
  # key.
  verify_key = regex(
    "-----BEGIN PUBLIC KEY-----\\s*MCowBQYDK2VwAyEA([A-Za-z0-9+/]{43}=)\\s*-----END PUBLIC KEY-----",
    tls_private_key.commands.public_key_pem,
  )[0]

  # The private key comes as unencrypted PKCS#8 PEM: 48 DER bytes, the 16 of the PKCS#8 and
  # algorithm framing (MC4CAQAwBQYDK2VwBCIEI...) and then the 32-byte key, not aligned on a base64
  # group. So the DER is decoded with ISO-8859-1, which maps each byte to one character, the last
  # 32 characters are taken (a regex counts characters; substr would count CR LF as one) and
  # encoded back the same way.
  signing_key_der = textdecodebase64(
    regex(
      "-----BEGIN PRIVATE KEY-----\\s*(MC4CAQAwBQYDK2VwBCIEI[A-Za-z0-9+/]{43})\\s*-----END PRIVATE KEY-----",
      tls_private_key.commands.private_key_pem_pkcs8,
    )[0],
    "ISO-8859-1",
  )
  signing_key = textencodebase64(regex("(?s)^.{16}(.{32})$", local.signing_key_der)[0], "ISO-8859-1")
}
