"""The proof an agent attaches to each message, and what the publisher does without one.

The metadata clients are replaced by small fakes of the two calls the provers make; the same
provers run against the simulator over HTTP in tests/contract/agent/test_proofs_over_http.py.
"""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from agent.health import Metrics, Readiness
from agent.loop import Agent
from agent.proofs import (
    AZURE_KEEP_SECONDS,
    REFUSED_RETRY_FIRST_SECONDS,
    REFUSED_RETRY_MAX_SECONDS,
    AzureAttestedProver,
    BackOffAfterRefusal,
    GceIdentityProver,
    ProofRefusedError,
    ProofUnavailableError,
)
from agent.sources.azure.client import AzureObservation
from agent.sources.azure.document import parse_scheduled_events
from agent.sources.azure.tracker import AzureTracker
from agent.sources.http import MetadataUnavailableError
from agent.state import AgentState
from agent.timing import SystemClock
from tests.kit import FakeClock
from tests.unit.agent.test_loop import FakeTransport
from tests.waiting import wait_until
from wire.envelope import decode
from wire.identity import (
    AZURE_ATTESTED,
    AZURE_PROOF_MAX_AGE_SECONDS,
    AZURE_SESSION_KEY,
    AZURE_SIGNATURE,
    GCE_TOKEN,
    content_digest,
    session_nonce,
    signed_digest,
    token_audience,
)
from wire.model import Cloud

BODY = json.dumps({"specversion": "1.0", "id": "a" * 64, "data": {"x": "é"}}, ensure_ascii=False).encode()


@dataclass
class FakeGce:
    audiences: list[str] = field(default_factory=list)
    down: bool = False
    refusing: int = 0  # the status a metadata server that refuses tokens answers (0: it gives them)
    asked: int = 0

    def identity_token(self, audience: str) -> str:
        self.asked += 1
        if self.refusing:
            raise MetadataUnavailableError("client_error", f"GET identity answered {self.refusing}", self.refusing)
        if self.down:
            raise MetadataUnavailableError("server_error", "503 during maintenance", 503)
        self.audiences.append(audience)
        return f"header.{len(self.audiences)}.signature"


@dataclass
class FakeImds:
    nonces: list[str] = field(default_factory=list)
    down: bool = False
    refusing: int = 0

    def attested_document(self, nonce: str) -> str:
        if self.refusing:
            raise MetadataUnavailableError("client_error", f"GET attested answered {self.refusing}", self.refusing)
        if self.down:
            raise MetadataUnavailableError("server_error", "500", 500)
        self.nonces.append(nonce)
        return f"pkcs7-for-{nonce}"


def unsigned(body: bytes) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(body)
    return document


def test_a_gce_message_carries_a_token_asked_for_its_own_digest() -> None:
    metadata = FakeGce()
    proven = GceIdentityProver(metadata, "maintenance-bridge").prove(BODY)

    document = unsigned(proven)
    assert document[GCE_TOKEN] == "header.1.signature"
    # The digest is that of the message without its proof: the functions recompute it from what they get.
    assert metadata.audiences == [token_audience("maintenance-bridge", content_digest(document))]
    assert content_digest(document) == content_digest(unsigned(BODY))
    assert {k: v for k, v in document.items() if k != GCE_TOKEN} == unsigned(BODY)


def test_without_a_gce_token_the_prover_says_so() -> None:
    with pytest.raises(ProofUnavailableError, match="503"):
        GceIdentityProver(FakeGce(down=True), "maintenance-bridge").prove(BODY)


def test_an_azure_message_carries_the_attested_document_of_a_key_that_signed_its_digest() -> None:
    imds, clock = FakeImds(), FakeClock()
    prover = AzureAttestedProver(imds, clock.monotonic)

    first, second = unsigned(prover.prove(BODY)), unsigned(prover.prove(b'{"id":"other"}'))

    # THEN the document was asked for once, with the nonce of the key that signs each message's digest
    public = base64.b64decode(first[AZURE_SESSION_KEY])
    assert imds.nonces == [session_nonce(public)]
    assert first[AZURE_ATTESTED] == second[AZURE_ATTESTED] == f"pkcs7-for-{session_nonce(public)}"
    key = Ed25519PublicKey.from_public_bytes(public)
    for document in (first, second):
        key.verify(base64.b64decode(document[AZURE_SIGNATURE]), signed_digest(content_digest(document)))
    assert first[AZURE_SIGNATURE] != second[AZURE_SIGNATURE]


def test_the_azure_document_is_renewed_with_a_new_key_and_kept_while_imds_fails() -> None:
    imds, clock = FakeImds(), FakeClock()
    prover = AzureAttestedProver(imds, clock.monotonic, refresh_seconds=3600)
    before = unsigned(prover.prove(BODY))

    # WHEN the hour is up but IMDS does not answer: the one in hand goes on
    clock.advance(3601)
    imds.down = True
    kept = unsigned(prover.prove(BODY))
    assert kept[AZURE_SESSION_KEY] == before[AZURE_SESSION_KEY]

    # AND once IMDS answers again, a new key and its document take over
    imds.down = False
    renewed = unsigned(prover.prove(BODY))
    assert renewed[AZURE_SESSION_KEY] != before[AZURE_SESSION_KEY]
    assert len(imds.nonces) == 2


def test_a_document_kept_while_imds_fails_is_dropped_before_the_functions_would_refuse_it() -> None:
    imds, clock = FakeImds(), FakeClock()
    prover = AzureAttestedProver(imds, clock.monotonic)
    prover.prove(BODY)

    # WHEN IMDS stays down until the document is older than the functions take (less the margin)
    imds.down = True
    clock.advance(AZURE_KEEP_SECONDS - 1)
    prover.prove(BODY)  # still kept
    clock.advance(1)

    # THEN no proof: an unproven message says so, a proof every verifier refuses would not
    with pytest.raises(ProofUnavailableError, match="attested document"):
        prover.prove(BODY)
    assert AZURE_KEEP_SECONDS < AZURE_PROOF_MAX_AGE_SECONDS


def test_without_any_attested_document_the_prover_says_so() -> None:
    with pytest.raises(ProofUnavailableError, match="attested document"):
        AzureAttestedProver(FakeImds(down=True), FakeClock().monotonic).prove(BODY)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405])
def test_a_client_error_is_a_refusal(status: int) -> None:
    # A metadata service without the endpoint (Microsoft's mock server: 404) or that will not give it
    # for this request (400) answers the same next time: waiting for a proof would only delay the message.
    with pytest.raises(ProofRefusedError):
        GceIdentityProver(FakeGce(refusing=status), "aud").prove(BODY)
    with pytest.raises(ProofRefusedError):
        AzureAttestedProver(FakeImds(refusing=status), FakeClock().monotonic).prove(BODY)


@pytest.mark.parametrize(
    "error",
    [
        MetadataUnavailableError("rate_limited", "429", 429),
        MetadataUnavailableError("client_error", "408", 408),  # the request timed out
        MetadataUnavailableError("client_error", "410", 410),  # IMDS: retry for up to 70 s
        MetadataUnavailableError("server_error", "503", 503),
        MetadataUnavailableError("timeout", "no answer in time"),
        MetadataUnavailableError("connection", "refused"),
        MetadataUnavailableError("client_error", "a 200 that is not a token", 200),
    ],
    ids=lambda error: str(error),
)
def test_throttling_server_errors_and_timeouts_stay_transient(error: MetadataUnavailableError) -> None:
    class Failing:
        def identity_token(self, audience: str) -> str:
            raise error

    with pytest.raises(ProofUnavailableError) as raised:
        GceIdentityProver(Failing(), "aud").prove(BODY)
    assert not isinstance(raised.value, ProofRefusedError)


def test_after_a_refusal_the_proof_is_asked_for_again_only_after_a_bounded_backoff() -> None:
    # GIVEN a metadata server that refuses identity tokens
    metadata, clock = FakeGce(refusing=404), FakeClock()
    prover = BackOffAfterRefusal(GceIdentityProver(metadata, "aud"), clock.monotonic)

    # WHEN messages are proven, THEN the first asks and is refused; the next are refused without asking
    for _ in range(3):
        with pytest.raises(ProofRefusedError, match="404"):
            prover.prove(BODY)
    assert metadata.asked == 1

    # AND each time it refuses again, the pause doubles, up to its cap
    pauses = []
    for _ in range(6):
        asked = metadata.asked
        waited = 0.0
        while metadata.asked == asked:
            clock.advance(1)
            waited += 1
            with pytest.raises(ProofRefusedError):
                prover.prove(BODY)
        pauses.append(waited)
    assert pauses[0] == REFUSED_RETRY_FIRST_SECONDS
    assert pauses[-1] == REFUSED_RETRY_MAX_SECONDS
    assert pauses == sorted(pauses)

    # WHEN the metadata server gives tokens again, THEN the next ask after the pause gets one,
    # and from then on every message asks at once
    metadata.refusing = 0
    clock.advance(REFUSED_RETRY_MAX_SECONDS)
    assert GCE_TOKEN in unsigned(prover.prove(BODY))
    assert GCE_TOKEN in unsigned(prover.prove(BODY))
    # AND a transient failure is passed on as such, to be waited for
    metadata.down = True
    with pytest.raises(ProofUnavailableError) as raised:
        prover.prove(BODY)
    assert not isinstance(raised.value, ProofRefusedError)


# ---------------------------------------------------------------- the publisher


def agent_with(tmp_path: Path, transport: FakeTransport, **options: Any) -> tuple[Agent, Metrics]:
    metrics = Metrics()
    options.setdefault("clock", SystemClock())
    agent = Agent(
        cloud=Cloud.AZURE,
        vm_name="web-0",
        tracker=AzureTracker("web-0", None),
        transport=transport,
        state=AgentState(tmp_path / "agent.db"),
        readiness=Readiness(follows_commands=False),
        metrics=metrics,
        flush_seconds=1.0,
        **options,
    )
    return agent, metrics


def observe(agent: Agent, *entries: dict[str, Any]) -> None:
    document = parse_scheduled_events(json.dumps({"DocumentIncarnation": 1, "Events": list(entries)}))
    agent.handle_observation(
        AzureObservation(document=document, observed_at=datetime(2026, 3, 1, tzinfo=timezone.utc), lag_bound=0.0)
    )


def reboot(event_id: str, *resources: str) -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventType": "Reboot",
        "EventStatus": "Scheduled",
        "Resources": list(resources),
        "NotBefore": "Mon, 02 Mar 2026 12:00:00 GMT",
    }


def run_until(agent: Agent, done: Any) -> None:
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    try:
        wait_until(done, 10, "the outbox to go out")
    finally:
        stop.set()
        runner.join(timeout=10)


def test_messages_go_out_with_their_proof(tmp_path: Path) -> None:
    transport, metadata = FakeTransport(), FakeGce()
    agent, metrics = agent_with(tmp_path, transport, prover=GceIdentityProver(metadata, "aud"))
    observe(agent, reboot("E1", "web-0"))

    run_until(agent, lambda: len(transport.published) == 1)

    (message,) = transport.published
    envelope = decode(message.body)
    assert envelope.extensions[GCE_TOKEN] == "header.1.signature"
    assert metadata.audiences == [token_audience("aud", envelope.digest)]
    assert metrics.value("mbridge_unproven_messages_total") == 0


def test_a_message_whose_proof_does_not_come_goes_without_one_after_the_wait_and_is_counted(tmp_path: Path) -> None:
    # GIVEN a metadata server that gives no identity token
    transport, metadata = FakeTransport(), FakeGce(down=True)
    agent, metrics = agent_with(
        tmp_path,
        transport,
        prover=GceIdentityProver(metadata, "aud"),
        proof_wait_seconds=0.3,
    )
    observe(agent, reboot("E1", "web-0"))

    # WHEN the publisher runs THEN the message goes out without a proof, once the wait is over
    run_until(agent, lambda: len(transport.published) == 1)
    assert GCE_TOKEN not in decode(transport.published[0].body).extensions
    assert metrics.value("mbridge_unproven_messages_total") == 1
    assert metrics.value("mbridge_errors_total", kind="identity_proof") == 1
    assert "503" in agent.last_proof_error


def test_a_refused_proof_costs_no_wait_is_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a metadata server that refuses identity tokens (404), and a clock that stands still:
    # a message that waited for its proof would never go
    transport, metadata = FakeTransport(), FakeGce(refusing=404)
    agent, metrics = agent_with(tmp_path, transport, prover=GceIdentityProver(metadata, "aud"), clock=FakeClock())
    observe(agent, reboot("E1", "web-0"), reboot("E2", "web-0"), reboot("E3", "web-0"))

    # WHEN the publisher runs
    caplog.set_level("INFO", logger="mbridge.agent")
    run_until(agent, lambda: len(transport.published) == 3)

    # THEN every message went out at once without a proof, each counted as unproven
    assert all(GCE_TOKEN not in decode(m.body).extensions for m in transport.published)
    assert metrics.value("mbridge_unproven_messages_total") == 3
    assert metrics.value("mbridge_errors_total", kind="identity_proof") == 3
    # AND the metadata server was asked once, not once per message, and the refusal logged once
    assert metadata.asked == 1
    refusals = [r for r in caplog.records if "refuses" in r.getMessage()]
    assert len(refusals) == 1
    assert refusals[0].levelname == "ERROR"
    assert "404" in agent.last_proof_error


@pytest.mark.parametrize(
    ("forward_all", "published"), [(False, ["E-MINE", "E-UNREAD"]), (True, ["E-MINE", "E-OTHER", "E-UNREAD"])]
)
def test_only_events_naming_this_vm_are_forwarded_unless_all_are_asked_for(
    tmp_path: Path, forward_all: bool, published: list[str]
) -> None:
    # GIVEN a document with this VM's event, another VM's, and one whose Resources cannot be read
    transport = FakeTransport()
    agent, metrics = agent_with(tmp_path, transport, forward_all=forward_all)
    unreadable = {**reboot("E-UNREAD"), "Resources": "web-0"}
    observe(agent, reboot("E-MINE", "web-0", "web-1"), reboot("E-OTHER", "web-1"), unreadable)

    run_until(agent, lambda: len(transport.published) == len(published))

    # THEN another VM's event is published only with --forward all (its report could move nothing)
    assert [decode(m.body).subject for m in transport.published] == published
    assert metrics.value("mbridge_events_not_forwarded_total") == (0 if forward_all else 1)
