"""Proof of this VM's identity on every message the agent publishes (docs/security.md).

The functions act on a report only for the VM its proof names, so the proof comes from the cloud's
own metadata service — nothing the VM could forge — and is bound to the message it travels with
(`wire.identity` defines the attributes and the binding):

- GCE: an instance identity token requested for this message's digest (one metadata GET per
  message; messages are a handful per maintenance).
- Azure: the attested document is asked for once per key, with a nonce derived from an Ed25519 key
  this agent makes and never writes down, and each message carries that key's signature of its
  digest. IMDS answers the attested document slowly and counts it against the 5 requests/s of
  the VM, so it is kept and asked again only after `AZURE_REFRESH_SECONDS` (with a new key).

A proof that cannot be fetched does not stop the agent: the caller publishes the message without
one after a short wait (the publisher, `agent.loop`), counts it, and says so in /metrics and
`--check`; the functions then decide by their trust setting. A metadata service that refuses the
proof outright (a 404 or 400: `ProofRefusedError`) costs no wait: the message goes at once, and the
service is asked again only every few minutes (`BackOffAfterRefusal`).
"""

from __future__ import annotations

import base64
import json
import logging
from typing import TYPE_CHECKING, Callable, Protocol

from agent.sources.http import MetadataUnavailableError
from wire.identity import (
    AZURE_ATTESTED,
    AZURE_PROOF_MAX_AGE_SECONDS,
    AZURE_PROOF_REFRESH_SECONDS,
    AZURE_SESSION_KEY,
    AZURE_SIGNATURE,
    GCE_TOKEN,
    content_digest,
    session_nonce,
    signed_digest,
    token_audience,
)
from wire.jsontext import load_json

if TYPE_CHECKING:  # imported when an Azure agent makes its key: a GCE agent without a verify key never loads it
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

LOGGER = logging.getLogger("mbridge.proofs")

# A new attested document (and key) every hour; one whose renewal fails is kept only while the
# functions still take it (wire.identity: the shorter a document lives, the less a ground key is
# worth), less a margin for the message's way to the bus.
AZURE_REFRESH_SECONDS = AZURE_PROOF_REFRESH_SECONDS
AZURE_KEEP_SECONDS = AZURE_PROOF_MAX_AGE_SECONDS - 300.0
# After a refusal the metadata service is asked again after a minute, then twice as long each time
# it refuses again, up to five minutes: a request every few minutes costs IMDS nothing, and a
# service that starts answering gives proofs again within minutes.
REFUSED_RETRY_FIRST_SECONDS = 60.0
REFUSED_RETRY_MAX_SECONDS = 300.0


class ProofUnavailableError(Exception):
    """The metadata service did not give a proof now; the message may go without one."""


class ProofRefusedError(ProofUnavailableError):
    """The metadata service refused the proof outright (`MetadataUnavailableError.refused`): asking
    again soon would get the same answer, so the message goes without one at once."""


def _unavailable(what: str, error: MetadataUnavailableError) -> ProofUnavailableError:
    kind = ProofRefusedError if error.refused else ProofUnavailableError
    return kind(f"{what}: {error}")


class Prover(Protocol):
    def prove(self, body: bytes) -> bytes:
        """The message body with this VM's proof attributes added.

        Raises:
            ProofUnavailableError: the metadata service did not answer with a proof.
        """
        ...


class IdentityTokens(Protocol):
    """GCE's metadata server (`GceMetadataClient`)."""

    def identity_token(self, audience: str) -> str: ...


class AttestedDocuments(Protocol):
    """Azure IMDS (`AzureImdsClient`)."""

    def attested_document(self, nonce: str) -> str: ...


class NoProof:
    """`--identity-proof none`: messages go as they are (functions with trust: reporter-name)."""

    def prove(self, body: bytes) -> bytes:
        return body


class GceIdentityProver:
    def __init__(self, client: IdentityTokens, audience: str) -> None:
        self._client = client
        self._audience = audience

    def prove(self, body: bytes) -> bytes:
        document = _document(body)
        try:
            token = self._client.identity_token(token_audience(self._audience, content_digest(document)))
        except MetadataUnavailableError as exc:
            raise _unavailable("no identity token from the metadata server", exc) from exc
        document[GCE_TOKEN] = token
        return _body(document)


class AzureAttestedProver:
    def __init__(
        self,
        client: AttestedDocuments,
        monotonic: Callable[[], float],
        refresh_seconds: float = AZURE_REFRESH_SECONDS,
    ) -> None:
        self._client = client
        self._monotonic = monotonic
        self._refresh_seconds = refresh_seconds
        self._key: Ed25519PrivateKey | None = None
        self._public = b""
        self._attested = ""
        self._fetched_at = 0.0

    def prove(self, body: bytes) -> bytes:
        document = _document(body)
        self._refresh()
        assert self._key is not None
        signature = self._key.sign(signed_digest(content_digest(document)))
        document[AZURE_ATTESTED] = self._attested
        document[AZURE_SESSION_KEY] = base64.b64encode(self._public).decode("ascii")
        document[AZURE_SIGNATURE] = base64.b64encode(signature).decode("ascii")
        return _body(document)

    def _refresh(self) -> None:
        if self._key is not None and self._monotonic() - self._fetched_at < self._refresh_seconds:
            return
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        key = Ed25519PrivateKey.generate()
        public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        try:
            attested = self._client.attested_document(session_nonce(public))
        except MetadataUnavailableError as exc:
            if self._key is None or self._monotonic() - self._fetched_at >= AZURE_KEEP_SECONDS:
                # None yet, or the one in hand is older than the functions take: no proof.
                self._key = None
                raise _unavailable("no attested document from IMDS", exc) from exc
            # The one in hand is still taken: keep it, ask again next time.
            LOGGER.warning("could not renew the attested document, keeping the current one: %s", exc)
            return
        self._key, self._public, self._attested = key, public, attested
        self._fetched_at = self._monotonic()


class BackOffAfterRefusal:
    """A prover that, once the metadata service refused a proof, does not ask it again for a while.

    Until then every message is refused at once, without a request; then the next message asks
    again. Each refusal in a row doubles the pause, up to `REFUSED_RETRY_MAX_SECONDS`; any other
    answer (a proof, or a failure that may pass) ends it.
    """

    def __init__(
        self,
        prover: Prover,
        monotonic: Callable[[], float],
        first_pause: float = REFUSED_RETRY_FIRST_SECONDS,
        longest_pause: float = REFUSED_RETRY_MAX_SECONDS,
    ) -> None:
        self._prover = prover
        self._monotonic = monotonic
        self._first_pause = first_pause
        self._longest_pause = longest_pause
        self._pause = first_pause
        self._refusal: str | None = None  # what the last refusal said, while it stands
        self._ask_again_at = 0.0

    def prove(self, body: bytes) -> bytes:
        if self._refusal is not None and self._monotonic() < self._ask_again_at:
            # a new error each time: raising one object again would lengthen its traceback for ever
            raise ProofRefusedError(self._refusal)
        try:
            proven = self._prover.prove(body)
        except ProofRefusedError as exc:
            self._refusal, self._ask_again_at = str(exc), self._monotonic() + self._pause
            self._pause = min(self._longest_pause, self._pause * 2)
            raise
        except ProofUnavailableError:
            self._stand_down()
            raise
        self._stand_down()
        return proven

    def _stand_down(self) -> None:
        self._refusal, self._pause = None, self._first_pause


def _document(body: bytes) -> dict[str, object]:
    document = load_json(body)
    if not isinstance(document, dict):
        raise ValueError("an outbox message is a CloudEvent (a JSON object)")
    return document


def _body(document: dict[str, object]) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
