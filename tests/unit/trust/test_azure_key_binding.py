"""The Azure key binding: one attested document, one agent key; and documents do not live long.

IMDS takes a 10-digit nonce, so the document names its key only by 10 digits of the key's SHA-256:
an attacker who lifts a document from the bus can grind keys until one matches (about 10^10 Ed25519
keys; 32 s against a hundred lifted documents on one core in C). Grinding is simulated here rather
than done: the verifier's nonce is cut to one digit, so two keys that share it are found in a few
tries, and everything else — the simulator's CA signing the document, the agent key signing each
message, the verifier checking both — is the real thing.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from functions.core.policy import Policy
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from functions.trust.azure_attested import load_certificates
from functions.trust.trust_file import MappedVms
from functions.trust.verifiers import MAX_DOCUMENT_AGE, AzureAttestedVerifier
from simulator.attestation import AttestationAuthority
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.envelope import decode, encode, envelope_for_event
from wire.identity import AZURE_ATTESTED, AZURE_SESSION_KEY, AZURE_SIGNATURE, ProofExpiredError, signed_digest
from wire.model import EventKind, EventStatus, MaintenanceEvent

NOW = datetime(2026, 1, 15, 12, 0, 0, tzinfo=timezone.utc)
VM_ID = "02aab8a4-74ef-476e-8182-f6d2ba4166a6"
SUBSCRIPTION = "8d10da13-8125-4ba9-a717-bf7490507b3d"


def one_digit(public: bytes) -> str:
    """A nonce weak enough to collide: what grinding would find, found in a few tries."""
    return str(public[0] % 10)


@pytest.fixture(scope="module")
def authority() -> AttestationAuthority:
    return AttestationAuthority.generate(NOW)


def verifier(authority: AttestationAuthority) -> AzureAttestedVerifier:
    return AzureAttestedVerifier(
        roots=load_certificates(authority.roots_pem()),
        intermediates=load_certificates(authority.intermediates_pem()),
        directory=MappedVms({VM_ID: "web-0"}),
        subscriptions=[SUBSCRIPTION],
        nonce_of=one_digit,
    )


def key_for(nonce: str) -> tuple[Ed25519PrivateKey, bytes]:
    """A key whose (weakened) nonce is `nonce`: the grinding, in a few tries."""
    while True:
        key = Ed25519PrivateKey.generate()
        public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        if one_digit(public) == nonce:
            return key, public


def proven(event: MaintenanceEvent, document: str, key: Ed25519PrivateKey, public: bytes, at: datetime) -> bytes:
    """The message as an agent with `key` publishes it, the document attached."""
    envelope = envelope_for_event(event, at)
    body = json.loads(encode(envelope))
    body[AZURE_ATTESTED] = document
    body[AZURE_SESSION_KEY] = base64.b64encode(public).decode()
    body[AZURE_SIGNATURE] = base64.b64encode(key.sign(signed_digest(envelope.digest))).decode()
    return json.dumps(body).encode()


def reboot(**fields: object) -> MaintenanceEvent:
    values: dict[str, object] = {
        "kind": EventKind.REBOOT,
        "status": EventStatus.SCHEDULED,
        "reporter": "web-0",
        "resources": ("web-0",),
        "duration_seconds": -1,
        "not_before": NOW + timedelta(minutes=15),
        "event_id": "E-REBOOT",
    }
    values.update(fields)
    return azure_event(**values)


def test_a_ground_key_passes_every_signature_but_the_document_is_bound_to_its_first_key(
    authority: AttestationAuthority,
) -> None:
    # GIVEN web-0's agent key K1 and the document IMDS made for it
    genuine_key = Ed25519PrivateKey.generate()
    genuine_public = genuine_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    document = authority.sign(VM_ID, SUBSCRIPTION, one_digit(genuine_public), NOW)["signature"]
    # AND an attacker's key K2 ground to the same nonce, signing web-0's Reboot republished as a 5 s Freeze
    ground_key, ground_public = key_for(one_digit(genuine_public))
    assert ground_public != genuine_public
    at = NOW + timedelta(minutes=1)
    genuine = proven(reboot(), document, genuine_key, genuine_public, at)
    forged = proven(reboot(kind=EventKind.FREEZE, duration_seconds=5), document, ground_key, ground_public, at)

    # WHEN the verifier checks both: each signature and the nonce check out
    checked = verifier(authority)
    first, second = (checked.verify(decode(body), at, at) for body in (genuine, forged))
    assert first.vm == second.vm == "web-0"
    # THEN both name the same document, with different keys: the store tells them apart
    assert first.binding is not None
    assert second.binding is not None
    assert first.binding.key == second.binding.key
    assert first.binding.value != second.binding.value

    # AND through `process`, the genuine report acts, the forgery is refused, and nothing else is approved
    store, pool, sent = SqliteStore(":memory:"), FakeBalancer({"web": ("web-0", "web-1")}), RecordingSender()
    deps = Deps(store, pool, sent, store, Policy(), verifier=checked, monotonic=FakeClock(at).monotonic)
    assert process(genuine, deps, at).result == "processed"
    assert process(forged, deps, at).result == "unverified"
    assert [(c.target, c.execute_at) for c in sent.commands] == [("web-0", at + timedelta(seconds=30))]
    (refusal,) = [r.reason for r in store.query() if r.kind == "unverified"]
    assert "first seen with another key" in refusal
    store.close()


def test_a_document_older_than_an_agent_ever_uses_one_is_refused(authority: AttestationAuthority) -> None:
    # GIVEN a document made at NOW, still within the 6 hours IMDS gives it
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    document = authority.sign(VM_ID, SUBSCRIPTION, one_digit(public), NOW)["signature"]
    checked = verifier(authority)

    # WHEN a message carrying it is taken by the bus within the agents' limit, and once past it
    fresh = NOW + MAX_DOCUMENT_AGE - timedelta(seconds=1)
    stale = NOW + MAX_DOCUMENT_AGE + timedelta(seconds=1)

    # THEN the first is web-0's, the second is refused as expired: no agent uses a document that old
    assert checked.verify(decode(proven(reboot(), document, key, public, fresh)), fresh, fresh).vm == "web-0"
    with pytest.raises(ProofExpiredError, match="agents renew theirs every 3600 s"):
        checked.verify(decode(proven(reboot(), document, key, public, stale)), stale, stale)
