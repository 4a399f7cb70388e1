"""Who sent a message: the proof an agent attaches, and the port that checks it.

Neither Service Bus nor Pub/Sub tells a subscriber who published a message, and every agent may
publish. So an agent attaches proof of its VM's identity from the cloud's own metadata service,
and the functions act on a report only for the VM the proof names (`process`: a verified report
speaks only for its own VM). The proof travels in CloudEvents extension attributes, outside the
envelope id and `data`, and is bound to the rest of the message through `content_digest`.

- Azure: the IMDS attested document (PKCS#7 signed by Azure) whose nonce is derived from a key the
  agent made (`session_nonce`), and that key's Ed25519 signature over the message's digest
  (`signed_digest`). The nonce has only 10 digits, so the document cannot carry the digest itself;
  docs/security.md says what this binding does and does not stop.
- GCE: the instance identity token, requested with the message's digest in its audience
  (`token_audience`), so a token cannot be moved to another message.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from wire.errors import BridgeError

if TYPE_CHECKING:
    from wire.envelope import Envelope

# The extension attributes of the proof (CloudEvents names: lowercase a-z, 0-9, at most 20).
AZURE_ATTESTED = "azattested"  # the `signature` of the IMDS attested document (base64 PKCS#7)
AZURE_SESSION_KEY = "azsessionkey"  # the agent's Ed25519 public key (base64 of the 32 raw bytes)
AZURE_SIGNATURE = "azsignature"  # that key's signature of `signed_digest(content_digest(...))`
GCE_TOKEN = "gceidtoken"  # noqa: S105 (a name, not a secret) the instance identity token (a JWT)
PROOF_ATTRIBUTES = frozenset({AZURE_ATTESTED, AZURE_SESSION_KEY, AZURE_SIGNATURE, GCE_TOKEN})

DEFAULT_AUDIENCE = "maintenance-bridge"
# The format tag of a trust file (functions/trust/trust_file.py), which the simulator writes.
TRUST_FILE_FORMAT = "maintenance-bridge trust 1"
NONCE_DIGITS = 10  # what IMDS accepts as the nonce of an attested document
# An agent asks for a new attested document (with a new key) this often, and keeps using one it
# has for at most the longer age when a renewal fails; the functions refuse a document older than
# that when the bus took the message. The shorter the life, the less time a ground key is worth.
AZURE_PROOF_REFRESH_SECONDS = 3600.0
AZURE_PROOF_MAX_AGE_SECONDS = 5400.0
_SIGNED_PREFIX = b"maintenance-bridge proof v1\n"


def content_digest(document: Mapping[str, Any]) -> str:
    """Lowercase hex SHA-256 of the CloudEvent as JSON, without the proof attributes.

    Taken over the message as sent (keys sorted, no spaces, UTF-8), not over what a reader
    understood of it: fields a newer agent adds are covered too, and a reader that drops them
    still computes the digest the agent signed.
    """
    unsigned = {name: value for name, value in document.items() if name not in PROOF_ATTRIBUTES}
    text = json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def token_audience(base: str, digest: str) -> str:
    """The audience a GCE identity token is requested for: the deployment's audience and the digest."""
    return f"{base.rstrip('/')}/{digest}"


def session_nonce(public_key: bytes) -> str:
    """The attested document's nonce for an agent key: 10 decimal digits of SHA-256 of the raw key."""
    return str(int.from_bytes(hashlib.sha256(public_key).digest(), "big") % 10**NONCE_DIGITS).zfill(NONCE_DIGITS)


def signed_digest(digest: str) -> bytes:
    """What the agent's Azure session key signs for one message (a fixed prefix, then the digest)."""
    return _SIGNED_PREFIX + digest.encode("ascii")


@dataclass(frozen=True)
class ProofBinding:
    """A part of a proof that must always come with the same value: the functions' store keeps the
    first value seen under `key`, and a message bringing another is refused as a forgery.

    Azure: an attested document is issued for one agent key (its nonce is 10 digits of the key's
    SHA-256), so one document seen with two keys means the second was ground to match the nonce.
    """

    key: str
    value: str


@dataclass(frozen=True)
class Identity:
    """The VM a message comes from, and how that is known (for the audit log)."""

    vm: str
    how: str  # attested | reporter-name
    detail: str = ""  # e.g. the vmId and subscription the attested document named
    # The VM's full identity in the deployment's scope, for the audit log: an Azure resource id,
    # or projects/P/zones/Z/instances/NAME (id N) on GCE. Empty when the name is all there is.
    resource: str = ""
    binding: ProofBinding | None = None


class UnverifiedError(BridgeError):
    """The message's proof is missing, invalid, expired or names no VM we can resolve.

    Not retried: the message is audited as `unverified` and nothing is done for it.
    """


class ProofExpiredError(UnverifiedError):
    """The proof was made for this message, but it had expired when the bus took it: a message kept
    back, or sent again long after it was made (a dead-lettered message resubmitted, say). The
    functions judge it as any other: not acted on. Proofs are not taken past their life, or a
    replayed old `completed` could put a VM back in the middle of its maintenance."""


class IdentityVerifier(Protocol):
    """Checks the proof attached to a message and names the VM it comes from."""

    def verify(self, envelope: Envelope, accepted_at: datetime, now: datetime) -> Identity:
        """The VM proven by the envelope's proof attributes (`Envelope.extensions`) for a message of
        `Envelope.digest`.

        `accepted_at` is when the bus took the message (a proof valid then is valid: a backlog
        must not turn genuine reports into forgeries); `now` is the present.

        Raises:
            UnverifiedError: no valid proof.
            RetryableError: the proof could not be checked now (e.g. signing keys unreachable).
        """
        ...


class ReporterName:
    """Trust `trust: reporter-name`: the reporter named in the message is taken at its word.

    Only for setups whose VMs have no metadata identity. Any VM that can publish can speak for
    any other: docs/security.md.
    """

    def verify(self, envelope: Envelope, accepted_at: datetime, now: datetime) -> Identity:
        return Identity(vm=envelope.source.rsplit("/", 1)[-1], how="reporter-name")
