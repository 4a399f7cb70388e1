"""Proofs of identity end to end over HTTP: the agent's provers against the simulator's metadata
service, verified by the functions' verifiers with the run's trust file.

The simulator signs with keys it makes for the run; everything else is the code that runs in the
clouds: the same metadata clients, provers, envelope codec and verifiers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from agent.proofs import AzureAttestedProver, GceIdentityProver, Prover
from agent.sources.azure.client import AzureImdsClient
from agent.sources.gce.client import GceMetadataClient
from functions.trust.trust_file import verifier_from_trust
from functions.trust.verifiers import CloudVerifier
from simulator.server import Simulator
from tests.factories import azure_event
from wire.envelope import decode, encode, envelope_for_event
from wire.identity import DEFAULT_AUDIENCE, PROOF_ATTRIBUTES, Identity, UnverifiedError
from wire.model import Cloud, EventKind, EventStatus

VMS = ("web-0", "web-1")


class Run:
    def __init__(self, simulator: Simulator) -> None:
        self.simulator = simulator
        self.cloud = Cloud(simulator.cloud.value)
        self.verifier: CloudVerifier = verifier_from_trust(json.loads(json.dumps(simulator.trust())))
        self._clients: list[AzureImdsClient | GceMetadataClient] = []

    def prover(self, vm: str) -> Prover:
        url = self.simulator.base_urls[VMS.index(vm)]
        if self.cloud is Cloud.AZURE:
            azure = AzureImdsClient.for_base_url(url)
            self._clients.append(azure)
            return AzureAttestedProver(azure, lambda: 0.0)
        gce = GceMetadataClient.for_base_url(url)
        self._clients.append(gce)
        return GceIdentityProver(gce, DEFAULT_AUDIENCE)

    def verify(self, body: bytes, accepted_at: datetime | None = None) -> Identity:
        now = datetime.now(timezone.utc)
        return self.verifier.verify(decode(body), accepted_at or now, now)

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
    event = azure_event(
        cloud=cloud,
        event_id="E-1" if cloud is Cloud.AZURE else "gce-maintenance-1",
        kind=EventKind.REBOOT if cloud is Cloud.AZURE else EventKind.LIVE_MIGRATE,
        status=EventStatus.SCHEDULED,
        reporter=reporter,
        resources=(reporter,),
        **fields,
    )
    return encode(envelope_for_event(event, datetime.now(timezone.utc)))


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
