"""Proofs of identity end to end over HTTP: the agent's provers against the simulator's metadata
service, verified by the functions' verifiers with the run's trust file.

The simulator signs with keys it makes for the run; everything else is the code that runs in the
clouds: the same metadata clients, provers, envelope codec and verifiers.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import requests

from agent.health import Metrics, Readiness
from agent.loop import Agent
from agent.messages import event_message
from agent.proofs import REFUSED_RETRY_FIRST_SECONDS, AzureAttestedProver, GceIdentityProver, Prover
from agent.sources.azure.client import AzureImdsClient
from agent.sources.azure.tracker import AzureTracker
from agent.sources.gce.client import GceMetadataClient
from agent.state import AgentState
from functions.trust.trust_file import verifier_from_trust
from functions.trust.verifiers import CloudVerifier
from simulator.server import Simulator
from tests.factories import azure_event
from tests.kit import FakeClock
from tests.unit.agent.test_loop import FakeTransport
from tests.waiting import wait_until
from wire.envelope import decode, encode, envelope_for_event
from wire.identity import (
    AZURE_SESSION_KEY,
    DEFAULT_AUDIENCE,
    PROOF_ATTRIBUTES,
    Identity,
    UnverifiedError,
    content_digest,
)
from wire.model import Cloud, EventKind, EventStatus, MaintenanceEvent
from wire.transports.base import OutboundMessage, TransportUnavailableError

VMS = ("web-0", "web-1")


class Run:
    def __init__(self, simulator: Simulator) -> None:
        self.simulator = simulator
        self.cloud = Cloud(simulator.cloud.value)
        self.verifier: CloudVerifier = verifier_from_trust(json.loads(json.dumps(simulator.trust())))
        self._clients: list[AzureImdsClient | GceMetadataClient] = []

    def prover(self, vm: str, clock: FakeClock | None = None) -> Prover:
        url = self.simulator.base_urls[VMS.index(vm)]
        if self.cloud is Cloud.AZURE:
            azure = AzureImdsClient.for_base_url(url)
            self._clients.append(azure)
            return AzureAttestedProver(azure, (clock or FakeClock()).monotonic)
        gce = GceMetadataClient.for_base_url(url)
        self._clients.append(gce)
        return GceIdentityProver(gce, DEFAULT_AUDIENCE)

    def verify(self, body: bytes, accepted_at: datetime | None = None) -> Identity:
        now = datetime.now(timezone.utc)
        return self.verifier.verify(decode(body), accepted_at or now, now)

    def faults(self, **change: object) -> None:
        response = requests.post(f"{self.simulator.base_urls[0]}/_sim/faults", json=change, timeout=10)
        assert response.status_code == 200, response.text

    def close(self) -> None:
        for client in self._clients:
            client.close()


@pytest.fixture(params=[Cloud.AZURE, Cloud.GCE], ids=["azure", "gce"])
def run(request: pytest.FixtureRequest) -> Iterator[Run]:
    with Simulator(cloud=request.param.value, vm_names=VMS) as simulator:
        started = Run(simulator)
        yield started
        started.close()


def report(cloud: Cloud, reporter: str = "web-0", **fields: object) -> bytes:
    return encode(envelope_for_event(reported_event(cloud, reporter, **fields), datetime.now(timezone.utc)))


def reported_event(cloud: Cloud, reporter: str = "web-0", **fields: object) -> MaintenanceEvent:
    return azure_event(
        cloud=cloud,
        event_id="E-1" if cloud is Cloud.AZURE else "gce-maintenance-1",
        kind=EventKind.REBOOT if cloud is Cloud.AZURE else EventKind.LIVE_MIGRATE,
        status=EventStatus.SCHEDULED,
        reporter=reporter,
        resources=(reporter,),
        **fields,
    )


def record_reports(state: AgentState, cloud: Cloud, *descriptions: str) -> None:
    """Messages in the outbox, as the agent records its reports."""
    now = datetime.now(timezone.utc)
    state.record(
        [(event_message(reported_event(cloud, description=text), now), now.timestamp()) for text in descriptions]
    )


def test_a_proven_report_is_verified_as_its_own_vm(run: Run) -> None:
    body = run.prover("web-0").prove(report(run.cloud))
    identity = run.verify(body)
    assert (identity.vm, identity.how) == ("web-0", "attested")


def test_a_vms_proof_names_that_vm_whatever_the_report_claims(run: Run) -> None:
    # web-1 publishes a report that claims to come from web-0: the proof says web-1
    forged = run.prover("web-1").prove(report(run.cloud, reporter="web-0"))
    assert run.verify(forged).vm == "web-1"


def test_a_changed_message_or_a_proof_moved_to_another_message_is_refused(run: Run) -> None:
    cloud = run.cloud
    prover = run.prover("web-0")
    genuine = json.loads(prover.prove(report(cloud)))

    changed = dict(genuine, data={**genuine["data"], "duration_seconds": 7})
    with pytest.raises(UnverifiedError):
        run.verify(json.dumps(changed).encode())

    # the proof of another genuine message of the same VM, put on this one
    other = json.loads(prover.prove(report(cloud, description="another message")))
    moved = {**genuine, **{name: other[name] for name in PROOF_ATTRIBUTES if name in other}}
    with pytest.raises(UnverifiedError, match=r"another message|not valid proof for this message"):
        run.verify(json.dumps(moved).encode())


def test_a_report_without_proof_is_refused(run: Run) -> None:
    with pytest.raises(UnverifiedError, match=r"no .*proof|no GCE identity token"):
        run.verify(report(run.cloud))


def test_a_proof_is_refused_once_it_expired_when_the_bus_took_the_message(run: Run) -> None:
    body = run.prover("web-0").prove(report(run.cloud))
    later = datetime.now(timezone.utc) + timedelta(hours=7)  # past a token's hour and a document's six
    with pytest.raises(UnverifiedError, match=r"expire|valid"):
        run.verify(body, accepted_at=later)


def test_a_metadata_service_that_refuses_proofs_costs_no_wait_and_proofs_come_back(run: Run, tmp_path: Path) -> None:
    # GIVEN the VM's metadata service refusing the proof endpoint (404, as Microsoft's mock server
    # does), and a clock that stands still: a message that waited for its proof would never go
    run.faults(refuse_proofs=404)
    clock, transport, metrics = FakeClock(), FakeTransport(), Metrics()
    with running_agent(run, tmp_path / "agent.db", transport, clock, metrics) as state:
        record_reports(state, run.cloud, "first", "second")

        # WHEN the agent runs, THEN both messages go out at once, without a proof, counted
        wait_until(lambda: len(transport.published) == 2, 10, "the messages to go out")
        assert metrics.value("mbridge_unproven_messages_total") == 2
        with pytest.raises(UnverifiedError):
            run.verify(transport.published[0].body)

        # WHEN the metadata service gives proofs again and the time to ask again has come
        run.faults(refuse_proofs=0)
        clock.advance(REFUSED_RETRY_FIRST_SECONDS)
        record_reports(state, run.cloud, "third")

        # THEN the next message carries a proof the functions verify as this VM's
        wait_until(lambda: len(transport.published) == 3, 10, "the next message to go out")
        assert run.verify(transport.published[2].body).vm == "web-0"
        assert metrics.value("mbridge_unproven_messages_total") == 2


class AnswerLost(FakeTransport):
    """A bus that takes every message and whose answer never reaches the agent: the agent cannot
    mark one published, as when it is killed between the write and the mark."""

    def publish(self, message: OutboundMessage) -> None:
        super().publish(message)
        raise TransportUnavailableError("the bus took the message; its answer was lost")


def test_a_message_sent_again_by_the_next_life_is_the_same_event_under_that_lifes_proof(
    run: Run, tmp_path: Path
) -> None:
    # GIVEN an agent whose bus took a report but whose answer was lost, and which then stopped
    state_path = tmp_path / "agent.db"
    lost = AnswerLost()
    with running_agent(run, state_path, lost) as state:
        record_reports(state, run.cloud, "first")
        wait_until(lambda: len(lost.published) >= 1, 10, "the report to reach the bus")

    # WHEN the agent starts again on the same state
    sent_again = FakeTransport()
    with running_agent(run, state_path, sent_again):
        wait_until(lambda: len(sent_again.published) == 1, 10, "the report to go out again")

    # THEN the repeat is the same event, byte for byte once the proof is set aside ...
    first, repeat = lost.published[0], sent_again.published[0]
    first_document, repeat_document = json.loads(first.body), json.loads(repeat.body)
    assert decode(repeat.body).id == decode(first.body).id
    assert content_digest(repeat_document) == content_digest(first_document)
    # ... proven by the new life, and the functions verify both as this VM's
    assert PROOF_ATTRIBUTES & set(first_document), "the first report carried no proof"
    assert run.verify(first.body).vm == run.verify(repeat.body).vm == "web-0"
    if run.cloud is Cloud.AZURE:
        # ... each life with a key of its own, never written to disk: under a bus id of its own (the
        # digest of the body as sent), so the functions, not the broker, know it for a repeat. (A
        # GCE token asked for the same message within the same second may be the same token.)
        assert repeat_document[AZURE_SESSION_KEY] != first_document[AZURE_SESSION_KEY]
        assert repeat.bus_id != first.bus_id


@contextmanager
def running_agent(
    run: Run, state_path: Path, transport: FakeTransport, clock: FakeClock | None = None, metrics: Metrics | None = None
) -> Iterator[AgentState]:
    """One life of the agent web-0 on `state_path`, publishing through `transport`, stopped on exit."""
    clock, state = clock or FakeClock(), AgentState(state_path)
    agent = Agent(
        cloud=run.cloud,
        vm_name="web-0",
        tracker=AzureTracker("web-0", None),  # not used: the test records the messages itself
        transport=transport,
        state=state,
        readiness=Readiness(follows_commands=False),
        metrics=metrics or Metrics(),
        clock=clock,
        flush_seconds=0.5,
        prover=run.prover("web-0", clock),
    )
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    try:
        yield state
    finally:
        stop.set()
        runner.join(timeout=10)
        state.close()
