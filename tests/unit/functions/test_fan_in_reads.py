"""What the completion of one VM's part of a large event reads: the end of as many other VMs as it
takes to find one still drained, not the end of every other VM of the event (which made the
completions of an event of N VMs cost N reads each, N² in all)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from functions.core.policy import Policy
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.envelope import encode, envelope_for_event
from wire.identity import ReporterName
from wire.model import EventKind, EventStatus, MaintenanceEvent

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
VMS = tuple(f"web-{index}" for index in range(10))


class ReadCountingStore(SqliteStore):
    """The local store, counting the reads of remembered values (where the ends of events are)."""

    recalls = 0

    def recall(self, key: str) -> bytes | None:
        self.recalls += 1
        return super().recall(key)


def reboot(status: EventStatus, reporter: str) -> MaintenanceEvent:
    return azure_event(
        kind=EventKind.REBOOT,
        status=status,
        event_id="E-FLEET",
        reporter=reporter,
        resources=VMS,
        duration_seconds=-1,
        not_before=NOW + timedelta(minutes=15),
    )


def counting_world(policy: Policy) -> tuple[ReadCountingStore, Deps]:
    """The core on a store that counts its reads of remembered values, over one pool of VMS."""
    store = ReadCountingStore(":memory:")
    deps = Deps(
        store=store,
        balancer=FakeBalancer({"web": VMS}),
        sender=RecordingSender(),
        audit=store,
        policy=policy,
        verifier=ReporterName(),
        monotonic=FakeClock().monotonic,
    )
    return store, deps


def test_a_completion_reads_the_end_of_one_other_drained_vm_not_of_all_of_them() -> None:
    # GIVEN an event of ten VMs of a pool with a budget, each drained on its own report
    store, deps = counting_world(Policy(default_max_drained=20))
    for vm in VMS:
        process(encode(envelope_for_event(reboot(EventStatus.SCHEDULED, vm), NOW)), deps, NOW)
    store.recalls = 0
    # WHEN the first VM's part completes, the nine others still drained
    outcome = process(encode(envelope_for_event(reboot(EventStatus.COMPLETED, VMS[0]), NOW)), deps, NOW)
    # THEN it read one other VM's end (which keeps the event's slot), not nine
    assert outcome.result == "processed"
    assert store.recalls == 1
    store.close()


def test_an_unlimited_pool_keeps_no_budget_record_and_its_completion_reads_no_other_end() -> None:
    # GIVEN the default policy (the default pool has no budget) and an event of ten VMs
    store, deps = counting_world(Policy())
    # WHEN each VM is drained on its own report
    for vm in VMS:
        process(encode(envelope_for_event(reboot(EventStatus.SCHEDULED, vm), NOW)), deps, NOW)
    # THEN every VM is out, and the pool records nothing: its record would be a wave's hottest key
    removed = {vm for method, vm in deps.balancer.calls if method == "remove"}  # type: ignore[attr-defined]
    assert removed == set(VMS)
    assert store._db.execute("SELECT COUNT(*) FROM reservations").fetchone() == (0,)
    # AND a completion has no slot to keep, so it reads no other VM's end
    store.recalls = 0
    outcome = process(encode(envelope_for_event(reboot(EventStatus.COMPLETED, VMS[0]), NOW)), deps, NOW)
    assert outcome.result == "processed"
    assert store.recalls == 0
    store.close()
