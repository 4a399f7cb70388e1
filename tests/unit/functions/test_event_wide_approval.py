"""An approval starts the Azure event for every VM it names, so it is sent only once each of them is out.

Azure's docs (Scheduled Events, 2020-07-01): "Acknowledging an event allows the event to proceed for
all Resources in the event, not just the VM that acknowledges the event." A report moves only its own
VM, so the first VM's report of an event of two must not approve it while the second is still in its
pool: that VM would reboot undrained, up to 15 minutes early.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from functions.core.policy import Policy, Pool
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.envelope import encode, envelope_for_event
from wire.identity import ReporterName
from wire.model import EventKind, EventSource, EventStatus, MaintenanceEvent

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
SET = ("web-0", "web-1", "web-2")
BOTH = ("web-0", "web-1")


@dataclass
class World:
    store: SqliteStore
    pool: FakeBalancer = field(default_factory=lambda: FakeBalancer({"web": SET}))
    sent: RecordingSender = field(default_factory=RecordingSender)
    policy: Policy = field(default_factory=Policy)
    clock: FakeClock = field(default_factory=lambda: FakeClock(NOW))

    def report(self, event: MaintenanceEvent, by: str, at: datetime = NOW) -> Any:
        self.clock.advance_to(max(at, self.clock.now()))
        deps = Deps(
            self.store,
            self.pool,
            self.sent,
            self.store,
            self.policy,
            verifier=ReporterName(),  # who may speak for a VM is tested in test_trust.py
            monotonic=self.clock.monotonic,
        )
        body = encode(envelope_for_event(_by(event, by), at))
        return process(body, deps, at)

    def actions(self, vm: str) -> list[tuple[str, str]]:
        return [(r.action, r.reason) for r in self.store.query(vm=vm) if r.kind == "action"]


def _by(event: MaintenanceEvent, vm: str) -> MaintenanceEvent:
    return replace(event, reporter=vm)


@pytest.fixture
def world() -> Iterator[World]:
    store = SqliteStore(":memory:")
    yield World(store)
    store.close()


def reboot(status: EventStatus = EventStatus.SCHEDULED, **fields: Any) -> MaintenanceEvent:
    values: dict[str, Any] = {
        "kind": EventKind.REBOOT,
        "status": status,
        "resources": BOTH,
        "duration_seconds": -1,
        "not_before": NOW + timedelta(minutes=15),
        "event_id": "E-SHARED",
    }
    values.update(fields)
    return azure_event(**values)


def test_the_first_vms_report_drains_it_and_holds_the_approval_until_the_other_is_out(world: World) -> None:
    # GIVEN a platform Reboot of web-0 and web-1, reported first by web-0 alone
    world.report(reboot(), by="web-0")

    # THEN web-0 is out, web-1 still serves, and nothing is approved: an approval would start the
    # Reboot of web-1 too
    assert world.pool.members("web") == ["web-1", "web-2"]
    assert world.sent.commands == []
    assert ("none", "approval held until web-1 is out of its pools: Azure starts the event for every VM it names") in (
        world.actions("web-0")
    )

    # WHEN web-1 reports it two minutes later
    world.report(reboot(), by="web-1", at=NOW + timedelta(minutes=2))

    # THEN web-1 is out too, and the one approval goes to web-1's agent, the drain period counted
    # from the moment the last VM was out
    assert world.pool.members("web") == ["web-2"]
    (approval,) = world.sent.commands
    assert (approval.target, approval.event_id) == ("web-1", "E-SHARED")
    assert approval.execute_at == NOW + timedelta(minutes=2, seconds=30)


def test_a_named_vm_whose_report_never_comes_means_no_early_approval(world: World) -> None:
    # GIVEN web-0's report of a Reboot of web-0 and web-1, and web-1's agent dead
    world.report(reboot(), by="web-0")
    # WHEN the event starts at its NotBefore, and completes, as web-0 reports
    world.report(reboot(EventStatus.STARTED), by="web-0", at=NOW + timedelta(minutes=15))
    world.report(reboot(EventStatus.COMPLETED), by="web-0", at=NOW + timedelta(minutes=25))

    # THEN no approval was ever sent (Azure started it at NotBefore), and web-0 is back
    assert world.sent.commands == []
    assert world.pool.members("web") == list(SET)


def test_every_vm_reporting_an_event_sends_one_approval_in_all(world: World) -> None:
    # GIVEN both VMs report the Reboot, and each report is delivered twice
    for vm in BOTH:
        world.report(reboot(), by=vm)
        world.report(reboot(), by=vm)
    # THEN exactly one approval went out, to the VM whose report found every VM out
    assert [(c.target, c.execute_at) for c in world.sent.commands] == [("web-1", NOW + timedelta(seconds=30))]


def test_a_user_event_is_approved_at_once_but_only_once_every_vm_is_out(world: World) -> None:
    # GIVEN a user-initiated Redeploy of web-0 and web-1
    event = reboot(kind=EventKind.REDEPLOY, event_source=EventSource.USER)
    world.report(event, by="web-0")
    assert world.sent.commands == []
    world.report(event, by="web-1", at=NOW + timedelta(seconds=5))
    (approval,) = world.sent.commands
    assert (approval.target, approval.execute_at) == ("web-1", None)


def test_a_harmless_freeze_is_approved_at_once_and_once(world: World) -> None:
    # GIVEN a 5 s Freeze of web-0 and web-1: harmless for both, nothing is drained
    freeze = reboot(kind=EventKind.FREEZE, duration_seconds=5)
    for vm in BOTH:
        world.report(freeze, by=vm)
    # THEN the first report approves it at once, the second sends nothing and says why
    assert [(c.target, c.execute_at) for c in world.sent.commands] == [("web-0", None)]
    assert world.pool.members("web") == list(SET)
    assert world.actions("web-1") == [("none", "approved already, through web-0's agent")]


def test_an_approval_held_for_a_vm_waiting_for_its_budget_goes_once_that_vm_is_admitted_and_out(
    world: World,
) -> None:
    # GIVEN a pool of budget 1, holding a Reboot of web-2
    world.policy = Policy(pools=(Pool("web", frozenset(SET), max_drained=1),))
    world.report(reboot(resources=("web-2",), event_id="E-OTHER"), by="web-2")
    # AND a Reboot of web-0 and web-1 that both report: each waits for the slot
    world.report(reboot(), by="web-0")
    world.report(reboot(), by="web-1")
    assert [c.event_id for c in world.sent.commands] == ["E-OTHER"]

    # WHEN web-2's event completes
    world.report(
        reboot(EventStatus.COMPLETED, resources=("web-2",), event_id="E-OTHER"),
        by="web-2",
        at=NOW + timedelta(minutes=5),
    )

    # THEN both waiting VMs are admitted and drained, and the shared event is approved once
    assert world.pool.members("web") == ["web-2"]
    assert [(c.event_id, c.execute_at) for c in world.sent.commands] == [
        ("E-OTHER", NOW + timedelta(seconds=30)),
        ("E-SHARED", NOW + timedelta(minutes=5, seconds=30)),
    ]
