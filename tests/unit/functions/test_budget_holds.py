"""No report holds a disruption budget for ever.

A compromised VM may report a Scheduled event of its own VM that never completes: its reservation
would keep its pool's only slot, and another VM's genuine Reboot would wait through `scheduled` and
`started` and never be drained. So a reservation expires (docs/policy.md#disruption-budget), and a
waiting event whose NotBefore is near, or that started, is drained past the budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
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
from wire.model import EventKind, EventStatus, MaintenanceEvent

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
SET = ("web-0", "web-1", "web-2")
ONE_AT_A_TIME = Policy(pools=(Pool("web", frozenset(SET), max_drained=1),))


@dataclass
class World:
    store: SqliteStore
    pool: FakeBalancer = field(default_factory=lambda: FakeBalancer({"web": SET}))
    sent: RecordingSender = field(default_factory=RecordingSender)
    clock: FakeClock = field(default_factory=lambda: FakeClock(T0))

    def report(self, event: MaintenanceEvent, at: datetime) -> Any:
        self.clock.advance_to(max(at, self.clock.now()))
        deps = Deps(
            self.store,
            self.pool,
            self.sent,
            self.store,
            ONE_AT_A_TIME,
            verifier=ReporterName(),  # who may speak for a VM is tested in test_trust.py
            monotonic=self.clock.monotonic,
        )
        return process(encode(envelope_for_event(event, at)), deps, at)

    def actions(self, vm: str) -> list[tuple[str, str]]:
        return [(r.action, r.reason) for r in self.store.query(vm=vm) if r.kind == "action"]


@pytest.fixture
def world() -> Iterator[World]:
    store = SqliteStore(":memory:")
    yield World(store)
    store.close()


def reboot(vm: str, event_id: str, status: EventStatus, not_before: datetime | None, **fields: Any) -> MaintenanceEvent:
    values: dict[str, Any] = {
        "kind": EventKind.REBOOT,
        "status": status,
        "reporter": vm,
        "resources": (vm,),
        "duration_seconds": -1,
        "not_before": not_before,
        "event_id": event_id,
    }
    values.update(fields)
    return azure_event(**values)


def held_by_a_self_report(world: World) -> None:
    """web-1 (compromised) reports a Reboot of its own VM, NotBefore 15 min away, and never completes it."""
    taken = world.report(reboot("web-1", "E-HOLD", EventStatus.SCHEDULED, T0 + timedelta(minutes=15)), T0)
    assert [a.action for a in taken.actions] == ["drain", "approve"]


def test_a_self_report_that_never_completes_holds_the_slot_only_until_its_reservation_expires(world: World) -> None:
    # GIVEN the pool's only slot held by web-1's self-report since T0: it expires at NotBefore (T0 + 15 min)
    # + the 10 min Azure documents from Started to Completed + a 5 min margin = T0 + 30 min
    held_by_a_self_report(world)

    # WHEN web-0's genuine Reboot comes before that, and another after it
    before = world.report(
        reboot("web-0", "E-REAL", EventStatus.SCHEDULED, T0 + timedelta(hours=2)), T0 + timedelta(minutes=29)
    )
    after = world.report(
        reboot("web-2", "E-NEXT", EventStatus.SCHEDULED, T0 + timedelta(hours=2)), T0 + timedelta(minutes=31)
    )

    # THEN the first waits; the second finds the reservation expired: it no longer counts, and the audit
    # log says so once, naming the event and the VM that held it; the room goes to the oldest waiting
    # event, web-0's, as a released slot does, and web-2's waits behind it
    assert [a.action for a in before.actions] == ["wait"]
    assert [(a.action, a.vm) for a in after.actions] == [
        ("wait", "web-2"),
        ("drain", "web-0"),
        ("approve", "web-0"),
        ("wait", "web-2"),
    ]
    assert world.pool.drained == ["web-1", "web-0"]
    assert [p.event_key for p in world.store.parked("web")] == ["azure:e-next|web-2"]
    expired = [(action, reason) for action, reason in world.actions("web-1") if "expired" in reason]
    assert expired == [
        (
            "none",
            "the budget slot of event e-hold in pool 'web' expired at 2026-03-01T12:30:00Z (admitted at "
            "2026-03-01T12:00:00Z): no report ended it in time, so it no longer counts; what was drained for it "
            "stays out until the event ends",
        )
    ]


def test_a_waiting_reboot_is_drained_when_it_starts_whatever_the_budget(world: World) -> None:
    # GIVEN the only slot held by web-1's self-report, and web-0's genuine Reboot waiting for it
    held_by_a_self_report(world)
    not_before = T0 + timedelta(minutes=16)
    waiting = world.report(reboot("web-0", "E-REAL", EventStatus.SCHEDULED, not_before), T0 + timedelta(minutes=1))
    assert [a.action for a in waiting.actions] == ["wait"]

    # WHEN Azure starts it at its NotBefore (web-1's reservation still runs: Azure gives "" as NotBefore then)
    started = world.report(reboot("web-0", "E-REAL", EventStatus.STARTED, None), not_before)

    # THEN web-0 is drained past the budget, and it no longer waits
    assert [(a.action, a.vm) for a in started.actions] == [("drain", "web-0")]
    assert started.actions[0].reason == "drained past the budget: the event started (pool 'web' is at its budget of 1)"
    assert world.pool.drained == ["web-1", "web-0"]
    assert world.store.parked("web") == []


def test_a_reboot_whose_not_before_is_nearer_than_the_drain_period_is_drained_past_the_budget(world: World) -> None:
    # GIVEN the only slot held by web-1's self-report
    held_by_a_self_report(world)

    # WHEN web-0's Reboot is first seen 20 s before its NotBefore (less than the 30 s drain period + 5 s margin)
    at = T0 + timedelta(minutes=5)
    near = world.report(reboot("web-0", "E-REAL", EventStatus.SCHEDULED, at + timedelta(seconds=20)), at)

    # THEN it is drained anyway (Azure starts it then regardless), and approved at NotBefore less the margin
    assert [(a.action, a.vm) for a in near.actions] == [("drain", "web-0"), ("approve", "web-0")]
    assert near.actions[0].reason == (
        "drained past the budget: NotBefore at 2026-03-01T12:05:20Z is within the 30 s drain period and 5 s "
        "margin (pool 'web' is at its budget of 1)"
    )
    assert world.sent.commands[-1].execute_at == at + timedelta(seconds=15)


def test_a_reboot_whose_not_before_is_far_still_waits_for_a_live_reservation(world: World) -> None:
    # GIVEN the only slot held by web-1's self-report WHEN web-0's Reboot is 36 s from its NotBefore
    held_by_a_self_report(world)
    at = T0 + timedelta(minutes=5)
    far = world.report(reboot("web-0", "E-REAL", EventStatus.SCHEDULED, at + timedelta(seconds=36)), at)
    # THEN the budget holds
    assert [a.action for a in far.actions] == ["wait"]


def test_a_not_before_far_in_the_future_holds_no_longer_than_the_longest_documented_notice(world: World) -> None:
    # GIVEN web-1's self-report claiming a NotBefore a year away
    world.report(reboot("web-1", "E-HOLD", EventStatus.SCHEDULED, T0 + timedelta(days=365)), T0)

    # WHEN web-0's Reboot comes 31 min later, when no other event waits
    after = world.report(
        reboot("web-0", "E-REAL", EventStatus.SCHEDULED, T0 + timedelta(hours=2)), T0 + timedelta(minutes=31)
    )

    # THEN the claimed NotBefore counted as at most 15 min after the admission (Azure's longest notice)
    assert [a.action for a in after.actions] == ["drain", "approve"]


def test_an_event_without_not_before_holds_from_its_admission(world: World) -> None:
    # GIVEN web-1's self-report of a Reboot already started (no NotBefore), never completed
    world.report(reboot("web-1", "E-HOLD", EventStatus.STARTED, None), T0)

    # WHEN web-0's Reboot comes 14 min later, then 16 min later (admission + 10 min + 5 min margin)
    before = world.report(
        reboot("web-0", "E-REAL", EventStatus.SCHEDULED, T0 + timedelta(hours=2)), T0 + timedelta(minutes=14)
    )
    after = world.report(
        reboot("web-2", "E-NEXT", EventStatus.SCHEDULED, T0 + timedelta(hours=2)), T0 + timedelta(minutes=16)
    )

    # THEN it waits, then goes, ahead of the one that came after it
    assert [a.action for a in before.actions] == ["wait"]
    assert [(a.action, a.vm) for a in after.actions][1:3] == [("drain", "web-0"), ("approve", "web-0")]
