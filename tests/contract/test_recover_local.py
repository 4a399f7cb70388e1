"""The documented recovery on the local app (SQLite store, local pool, embedded bus), with the proofs
the simulator's metadata services really issue.

A completion whose restore fails for good is set aside (the local host's dead letters, as a cloud bus
dead-letters it). Resubmitted an hour later, once the deployment is fixed, it is judged as of when the
bus took it again: its proof has expired, so it is `unverified` and puts nothing back. `mbridge recover`
then puts the VM back through the completion's own path, and the audit log says who did it and why.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from functions.core.policy import Policy
from functions.core.ports import JsonObject
from functions.local_app.balancer import LocalPool
from functions.local_app.host import LocalFunctionHost
from functions.local_app.store import SqliteStore
from functions.trust.trust_file import verifier_from_trust
from mbridge.cli import main
from simulator.server import Simulator
from tests.factories import azure_event
from tests.identity import proven_by_metadata
from tests.kit import FakeClock
from wire.envelope import encode, envelope_for_event
from wire.errors import PermanentError
from wire.model import Cloud, EventKind, EventStatus, MaintenanceEvent
from wire.transports.base import OutboundMessage
from wire.transports.local import LocalBus

VM = "web-0"
EVENT_ID = {Cloud.AZURE: "5DD55B64-0A8B-4C53-9E2B-6E1F3D2A9B10", Cloud.GCE: "gce-web-0-maintenance-1"}
KIND = {Cloud.AZURE: EventKind.REBOOT, Cloud.GCE: EventKind.HOST_TERMINATE}


class PoolWithBrokenRestore(LocalPool):
    """The local pool, whose restore fails for good while `broken` (a role taken away, say)."""

    broken = False

    def restore(self, vm: str, memento: JsonObject) -> None:
        if self.broken:
            raise PermanentError(f"not authorised to add {vm} to its pool: grant the role, then resubmit")
        super().restore(vm, memento)


@dataclass
class Deployment:
    cloud: Cloud
    workdir: Path
    simulator: Simulator
    clock: FakeClock
    bus: LocalBus
    store: SqliteStore
    pool: PoolWithBrokenRestore
    host: LocalFunctionHost

    def report(self, status: EventStatus) -> bytes:
        """The VM's report of its event at `status`, proven by its metadata service now."""
        body = encode(envelope_for_event(event_of(self.cloud, status), self.clock.now()))
        return proven_by_metadata(self.cloud, self.simulator.base_urls[0], body)

    def publish(self, body: bytes, message_id: str = "") -> None:
        """Onto the bus (a resubmission is a new message: `message_id`), then the host takes it."""
        envelope_id = json.loads(body)["id"]
        assert self.bus.publish_event(OutboundMessage(envelope_id, body, VM, message_id=message_id))
        self.host.step()


def event_of(cloud: Cloud, status: EventStatus) -> MaintenanceEvent:
    return azure_event(
        cloud=cloud,
        event_id=EVENT_ID[cloud],
        kind=KIND[cloud],
        status=status,
        reporter=VM,
        resources=(VM,),
        duration_seconds=-1 if cloud is Cloud.AZURE else None,
        event_source=None,
        not_before=datetime(2026, 3, 1, 12, 15, tzinfo=timezone.utc),
    )


@pytest.fixture(params=[Cloud.AZURE, Cloud.GCE], ids=["azure", "gce"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    cloud: Cloud = request.param
    # The proofs are issued on the simulator's (real) clock: the functions' clock starts there.
    clock = FakeClock(datetime.now(timezone.utc).replace(microsecond=0))
    with Simulator(cloud=cloud.value, vm_names=[VM]) as simulator:
        bus, store = LocalBus(tmp_path / "bus.db"), SqliteStore(tmp_path / "functions.db")
        pool = PoolWithBrokenRestore(tmp_path / "pool.db")
        pool.add("web", [VM, "web-1"])
        verifier = verifier_from_trust(simulator.trust())
        host = LocalFunctionHost(bus, store, pool, Policy(), clock.now, verifier=verifier)
        yield Deployment(cloud, tmp_path, simulator, clock, bus, store, pool, host)
        for opened in (bus, store, pool):
            opened.close()


def test_a_dead_lettered_completion_resubmitted_an_hour_later_is_unverified_and_recover_puts_the_vm_back(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the VM drained for its event, whose completion could not put it back (the role was missing)
    deployment.publish(deployment.report(EventStatus.SCHEDULED))
    assert deployment.pool.members("web") == ["web-1"]
    deployment.pool.broken = True
    completed = deployment.report(EventStatus.COMPLETED)
    deployment.publish(completed)
    assert [letter.body for letter in deployment.store.dead_letters()] == [completed]

    # WHEN the deployment is fixed and the dead-lettered completion resubmitted two hours later
    deployment.pool.broken = False
    deployment.clock.advance(timedelta(hours=2))
    deployment.publish(completed, message_id="resubmitted")

    # THEN it is judged as of its resubmission: its proof has expired, it is unverified, the reason names the
    # recovery, and the VM is still out of its pool
    (refusal,) = [record for record in deployment.store.query(vm=VM) if record.kind == "unverified"]
    assert "expired" in refusal.reason
    assert "mbridge recover" in refusal.reason
    assert deployment.pool.members("web") == ["web-1"]

    # WHEN the operator lists what is still drained, and puts the VM back
    db = ["--db", str(deployment.workdir / "functions.db")]
    assert main(["recover", "list", *db]) == 0
    (listed,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    reason = "completion dead-lettered; ticket OPS-7"
    assert main(["recover", "restore", "--vm", VM, "--event", EVENT_ID[deployment.cloud],
                 "--reason", reason, "--by", "alice", *db]) == 0  # fmt: skip

    # THEN the listing showed the VM, its event and that the event's end was seen
    assert (listed["vm"], listed["event_id"].lower(), listed["state"]) == (
        VM,
        EVENT_ID[deployment.cloud].lower(),
        "removed",
    )
    assert (listed["end_seen"], listed["ended"]["status"], listed["kind"]) == (
        True,
        "completed",
        KIND[deployment.cloud].value,
    )
    assert listed["not_before"] == "2026-03-01T12:15:00Z"
    # AND the VM is back, nothing is drained any more, and the audit log says who put it back and why
    assert deployment.pool.members("web") == ["web-0", "web-1"]
    assert main(["recover", "list", *db]) == 0
    assert capsys.readouterr().out.splitlines() == ["restore web-0: recovered by alice: " + reason]
    records = deployment.store.query(vm=VM)
    (recovery,) = [record for record in records if record.kind == "recovery"]
    assert (recovery.action, recovery.detail["operator"], recovery.detail["reason"]) == ("restore", "alice", reason)
    assert "alice puts web-0 back" in recovery.reason
    (restored,) = [record for record in records if record.kind == "action" and record.action == "restore"]
    assert (restored.rule, restored.envelope_id) == ("recovery", recovery.envelope_id)
