"""The fleet view (functions/core/fleet.py) of audit logs the core itself wrote: agents' reports
through `process`, the control plane's through `process_central` and the silent-agent sweep, on the
local app's SQLite store and pool (the worlds of test_central.py and test_process.py).

GIVEN maintenance as the core processed it
WHEN  the view is built from the whole log
THEN  each (VM, event) row says who reported it, whether the VM was drained, approved, ended, and
      whether its agent was found silent, as the core's records tell it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from functions.core.fleet import FleetView, fleet_view
from functions.core.policy import Policy, Pool
from functions.local_app.store import SqliteStore
from tests.identity import proven
from tests.kit import FakeBalancer, RecordingSender
from tests.unit.functions import test_process
from tests.unit.functions.test_central import EVENT_ID, SET, SILENT_AFTER, START, World, reboot
from tests.unit.functions.test_trust import opened
from wire.envelope import envelope_for_command_result
from wire.errors import PermanentError
from wire.model import Cloud, CommandResult, EventStatus

NOT_BEFORE = START + timedelta(minutes=15)  # the Reboot's, as test_central reports it


@pytest.fixture
def world() -> Iterator[World]:
    with opened(World, SET) as made:
        yield made


def view(world: Any) -> FleetView:
    return fleet_view(world.store.query())


def columns(built: FleetView) -> list[tuple[str, str, str, str, str, str, bool]]:
    return [
        (row.vm, row.status, row.source, row.drained, built.approval(row), row.ended, row.silent) for row in built.rows
    ]


def test_an_agents_reboot_is_drained_approved_and_once_completed_restored(world: World) -> None:
    # GIVEN web-0's agent reports its Reboot scheduled
    world.agent(EventStatus.SCHEDULED)

    # THEN the row is upcoming: reported by the agent, drained, approved, with its NotBefore and kind
    (row,) = view(world).rows
    assert (row.vm, row.event_id, row.kind, row.not_before) == ("web-0", EVENT_ID, "reboot", NOT_BEFORE)
    assert columns(view(world)) == [("web-0", "scheduled", "agent", "yes", "sent", "", False)]

    # WHEN the agent answers the approval, and then reports the Reboot started and completed
    answer = CommandResult(world.sent.commands[0].command_id, True, EVENT_ID, "web-0")
    world.deliver(proven(envelope_for_command_result(answer, Cloud.AZURE, world.clock.now()), "web-0"))
    world.clock.advance(60)
    world.agent(EventStatus.STARTED)
    assert columns(view(world)) == [("web-0", "started", "agent", "yes", "accepted", "", False)]
    world.clock.advance(60)
    world.agent(EventStatus.COMPLETED)

    # THEN the row says it ended, the VM put back; its NotBefore stays the one reported when scheduled
    assert columns(view(world)) == [("web-0", "completed", "agent", "restored", "accepted", "completed", False)]
    assert view(world).rows[0].not_before == NOT_BEFORE


def test_a_silent_agents_event_is_the_centres_drained_on_its_word_and_never_approved(world: World) -> None:
    # GIVEN policy silent_agents: drain and web-1's Reboot reported by the control plane only
    world.policy = replace(world.policy, silent_agents="drain")
    world.centre(EventStatus.SCHEDULED, vms=("web-1",))
    assert columns(view(world)) == [("web-1", "scheduled", "centre", "no", "", "", False)]

    # WHEN the bound passes and the sweep finds its agent silent
    world.clock.advance(SILENT_AFTER)
    world.sweep()

    # THEN the row is silent and drained, never approved
    assert columns(view(world)) == [("web-1", "scheduled", "centre", "yes", "", "", True)]

    # WHEN the control plane reports the end
    world.centre(EventStatus.COMPLETED, vms=("web-1",))
    assert columns(view(world)) == [("web-1", "completed", "centre", "restored", "", "completed", True)]


def test_an_event_both_paths_reported_is_one_row_of_both_sources(world: World) -> None:
    # GIVEN web-0's Reboot reported by the control plane and by its agent, and web-1's by the control
    # plane only (one host)
    world.centre(EventStatus.SCHEDULED, vms=("web-0", "web-1"))
    world.agent(EventStatus.SCHEDULED, vm="web-0")

    # THEN web-0's row is of both paths, drained and approved; web-1's the centre's, not drained
    assert columns(view(world)) == [
        ("web-0", "scheduled", "both", "yes", "sent", "", False),
        ("web-1", "scheduled", "centre", "no", "sent", "", False),
    ]


def test_the_end_shown_is_the_first_one_reported(world: World) -> None:
    # GIVEN web-2's Reboot, canceled by its agent, then reported completed by the control plane
    world.agent(EventStatus.SCHEDULED, vm="web-2")
    world.agent(EventStatus.CANCELED, vm="web-2")
    world.centre(EventStatus.COMPLETED, vms=("web-2",))

    # THEN the end shown is the first one (the one the core kept)
    (row,) = view(world).rows
    assert (row.source, row.drained, row.ended) == ("both", "restored", "canceled")


@pytest.fixture
def budget_world() -> Iterator[test_process.World]:
    """test_process.py's world: a pool whose restores can be made to fail."""
    store = SqliteStore(":memory:")
    yield test_process.World(store, FakeBalancer({"web": test_process.SET}), RecordingSender(), Policy())
    store.close()


def test_a_waiting_event_a_dry_run_and_a_failed_restore_are_said_as_such(budget_world: test_process.World) -> None:
    world = budget_world
    # GIVEN a pool of one slot: E1 on web-0 drained, E2 on web-1 waiting
    world.policy = Policy(pools=(Pool("web", frozenset(test_process.SET), max_drained=1),))
    world.run(test_process.reboot(EventStatus.SCHEDULED, event_id="E1"))
    late = test_process.NOW + test_process.HOURS_2
    world.run(test_process.reboot(EventStatus.SCHEDULED, "web-1", event_id="E2", resources=("web-1",), not_before=late))
    assert columns(view(world)) == [
        ("web-0", "scheduled", "agent", "yes", "sent", "", False),
        ("web-1", "scheduled", "agent", "waiting", "", "", False),
    ]

    # WHEN E1's completion cannot put web-0 back
    world.pool.fail("restore", PermanentError("the NIC is locked"), vm="web-0", times=None)
    with pytest.raises(PermanentError):
        world.run(
            test_process.reboot(EventStatus.COMPLETED, event_id="E1"), at=test_process.NOW + timedelta(minutes=20)
        )

    # THEN web-0's row says so (ended, still out), and web-1's event was admitted into the freed slot
    assert columns(view(world)) == [
        ("web-0", "completed", "agent", "restore-failed", "sent", "completed", False),
        ("web-1", "scheduled", "agent", "yes", "sent", "", False),
    ]

    # WHEN a third event comes under a dry run
    world.policy = Policy(dry_run=True)
    world.run(test_process.reboot(EventStatus.SCHEDULED, "web-2", event_id="E3", resources=("web-2",)))

    # THEN nothing was taken out for it and no approval sent, and the view says so
    assert ("web-2", "scheduled", "agent", "dry-run", "dry-run", "", False) in columns(view(world))


def test_rows_come_by_notbefore_those_without_last(world: World) -> None:
    # GIVEN three events: one without a NotBefore (reported started), two with, the later first
    world.agent(EventStatus.STARTED, vm="web-2")
    for vm, minutes in (("web-1", 30), ("web-0", 10)):
        event = replace(
            reboot(EventStatus.SCHEDULED, of=vm), event_id=f"E-{vm}", not_before=START + timedelta(minutes=minutes)
        )
        world.report(event, by=vm, at=world.clock.now())

    # THEN they come by NotBefore, the one without last
    assert [(row.vm, row.event_id) for row in view(world).rows] == [
        ("web-0", "E-web-0"),
        ("web-1", "E-web-1"),
        ("web-2", EVENT_ID),
    ]


def test_refused_and_duplicate_reports_make_no_row_nor_source(world: World) -> None:
    # GIVEN web-1 forging web-0's report (refused), and web-2's report delivered twice
    forged = reboot(EventStatus.SCHEDULED, of="web-0")
    world.report(forged, by="web-1")
    world.agent(EventStatus.SCHEDULED, vm="web-2")
    world.agent(EventStatus.SCHEDULED, vm="web-2")

    # THEN only web-2 has a row, once, as its agent's
    assert columns(view(world)) == [("web-2", "scheduled", "agent", "yes", "sent", "", False)]
