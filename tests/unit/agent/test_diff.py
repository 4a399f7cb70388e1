"""The lifecycle diff of docs/contracts.md#event-lifecycle, as a table of before/after documents and values."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from agent.sources.azure.diff import azure_state_from_json, azure_state_to_json, diff_azure
from agent.sources.azure.document import ScheduledEventsDocument, parse_scheduled_events
from agent.sources.gce.diff import GceIdentity, GceKeyState, diff_gce, gce_state_from_json, gce_state_to_json
from tests.fixtures import fixture_text
from wire.errors import MalformedDocumentError
from wire.model import EventKind, EventStatus

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
NOT_BEFORE = "Sun, 01 Mar 2026 12:15:00 GMT"  # T0 + 15 minutes, a Reboot's notice
ME = GceIdentity(instance_id="4113390128391523715", reporter="gce-vm-0")


def doc(incarnation: int, *events: dict[str, Any]) -> ScheduledEventsDocument:
    return parse_scheduled_events(json.dumps({"DocumentIncarnation": incarnation, "Events": list(events)}))


def event(event_id: str = "E1", status: str = "Scheduled", **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "EventId": event_id,
        "EventStatus": status,
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm-0", "vm-1"],
        "NotBefore": NOT_BEFORE if status == "Scheduled" else "",
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    base.update(fields)
    return base


def statuses(changes: list[Any]) -> list[tuple[str, str]]:
    return [(c.event_id, c.status.value) for c in changes]


def azure(
    state: dict[str, Any], document: ScheduledEventsDocument, at: datetime = T0, approved: frozenset[str] = frozenset()
) -> Any:
    return diff_azure(state, document, reporter="vm-0", observed_at=at, approved=approved)


def restarted(state: dict[str, Any]) -> dict[str, Any]:
    """The state as an agent restarted from disk reads it back."""
    return azure_state_from_json(json.loads(json.dumps(azure_state_to_json(state))))


def test_documented_live_migration_yields_scheduled_started_completed() -> None:
    # GIVEN the four documented documents, seen one after the other by WestNO_0
    state: dict[str, Any] = {}
    seen = []
    for n in range(1, 5):
        state, changes = diff_azure(
            state,
            parse_scheduled_events(fixture_text(f"azure/live-migration-{n}.json")),
            reporter="WestNO_0",
            observed_at=T0,
        )
        seen.extend(changes)

    # THEN exactly three events, one EventId, in lifecycle order, each with its document's incarnation
    assert [(c.status, c.sequence) for c in seen] == [
        (EventStatus.SCHEDULED, "2"),
        (EventStatus.STARTED, "3"),
        (EventStatus.COMPLETED, "4"),
    ]
    assert {c.event_id for c in seen} == {"C7061BAC-AFDC-4513-B24B-AA5F13A16123"}
    assert all(c.concerns_reporter for c in seen)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        # new and Scheduled
        ([], [event()], [("E1", "scheduled")]),
        # hardware failure: new and already Started
        ([], [event(status="Started")], [("E1", "started")]),
        # approval or NotBefore reached
        ([event()], [event(status="Started")], [("E1", "started")]),
        # Azure cancels by removing a Scheduled event (before its NotBefore)
        ([event()], [], [("E1", "canceled")]),
        # an entry whose EventStatus cannot be read counts as not started yet
        ([], [event(status="Pending")], [("E1", "scheduled")]),
        ([event(status="Pending")], [event(status="Started")], [("E1", "started")]),
        ([event()], [event(status="Pending")], []),
        ([event(status="Pending", NotBefore=NOT_BEFORE)], [], [("E1", "canceled")]),
        # gone after Started is the completion
        ([event(status="Started")], [], [("E1", "completed")]),
        # NotBefore / Description / Duration changes are state only
        ([event()], [event(NotBefore="Tue, 20 Sep 2016 18:29:47 GMT", Description="later", DurationInSeconds=9)], []),
        # nothing changed
        ([event(status="Started")], [event(status="Started")], []),
        # ids compare case-insensitively (GUIDs)
        ([event("ab-CD")], [event("AB-cd", status="Started")], [("AB-cd", "started")]),
        # endings come before beginnings
        ([event("old", status="Started")], [event("new")], [("old", "completed"), ("new", "scheduled")]),
    ],
)
def test_azure_lifecycle(before: list[dict[str, Any]], after: list[dict[str, Any]], expected: list[Any]) -> None:
    state, _ = azure({}, doc(1, *before))
    _, changes = azure(state, doc(2, *after), at=T0 + timedelta(seconds=1))
    assert statuses(changes) == expected


def test_events_of_other_vms_are_forwarded_with_concerns_reporter_false() -> None:
    _, changes = azure({}, doc(2, event(Resources=["vm-7"])))
    assert len(changes) == 1
    assert not changes[0].concerns_reporter


def test_azure_state_survives_json_round_trip_so_a_restart_still_sees_completion() -> None:
    # GIVEN a Started event, saved as JSON and restored (an agent restart)
    state, _ = azure({}, doc(3, event(status="Started")))

    # WHEN the event is gone in the next document
    _, changes = azure(restarted(state), doc(4))

    # THEN the completion is detected
    assert statuses(changes) == [("E1", "completed")]


@pytest.mark.parametrize("kind", ["Reboot", "Terminate", "Preempt"])
def test_an_event_that_ran_while_the_agent_was_stopped_is_completed_not_canceled(kind: str) -> None:
    # GIVEN an agent that saw an event Scheduled (NotBefore in 15 minutes) and was then stopped
    state, _ = azure({}, doc(3, event(EventType=kind)))

    # WHEN it starts again after the NotBefore, and the event (Started and removed meanwhile) is gone
    _, changes = azure(restarted(state), doc(6), at=T0 + timedelta(minutes=40))

    # THEN the event ran: it is completed (a canceled Terminate or Preempt would put a deleted VM back)
    assert statuses(changes) == [("E1", "completed")]


def test_an_event_gone_before_its_not_before_across_a_restart_is_canceled() -> None:
    state, _ = azure({}, doc(3, event()))
    _, changes = azure(restarted(state), doc(4), at=T0 + timedelta(minutes=5))
    assert statuses(changes) == [("E1", "canceled")]


def test_an_event_this_agent_approved_is_completed_even_before_its_not_before() -> None:
    # GIVEN a Scheduled event this agent approved (Azure then starts it within seconds)
    state, _ = azure({}, doc(3, event("E1-Upper")))

    # WHEN the event is gone before its NotBefore, the Started step unseen (the agent was stopped)
    _, changes = azure(restarted(state), doc(5), at=T0 + timedelta(minutes=2), approved=frozenset({"e1-upper"}))

    # THEN it ran
    assert statuses(changes) == [("E1-Upper", "completed")]


@pytest.mark.parametrize("not_before", ["", "soon"])
def test_a_scheduled_event_with_no_readable_not_before_that_goes_away_is_completed(not_before: str) -> None:
    # Whether it ran cannot be known; "completed" never puts a deleted VM back.
    state, _ = azure({}, doc(3, event(EventType="Terminate", NotBefore=not_before)))
    _, changes = azure(state, doc(4), at=T0 + timedelta(seconds=2))
    assert statuses(changes) == [("E1", "completed")]


def test_the_end_of_an_unreadable_entry_carries_what_was_read_of_it() -> None:
    state, scheduled = azure({}, doc(3, event(EventType="Hibernate")))
    _, ended = azure(restarted(state), doc(4), at=T0 + timedelta(minutes=20))
    assert [(c.kind, c.status, c.unreadable) for c in scheduled + ended] == [
        (EventKind.UNKNOWN, EventStatus.SCHEDULED, ("EventType",)),
        (EventKind.UNKNOWN, EventStatus.COMPLETED, ("EventType",)),
    ]


def gce(state: dict[str, GceKeyState], key: str, value: str | None, at: datetime, etag: str = "e") -> Any:
    return diff_gce(state, key=key, value=value, sequence=etag, observed_at=at, identity=ME)


def test_gce_live_migration_is_scheduled_then_completed_with_one_id() -> None:
    state, first = gce({}, "maintenance-event", "NONE", T0)
    state, scheduled = gce(state, "maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE", T0 + timedelta(seconds=5))
    state, completed = gce(state, "maintenance-event", "NONE", T0 + timedelta(seconds=80))
    assert first == []
    assert [(c.kind, c.status) for c in scheduled + completed] == [
        (EventKind.LIVE_MIGRATE, EventStatus.SCHEDULED),
        (EventKind.LIVE_MIGRATE, EventStatus.COMPLETED),
    ]
    assert scheduled[0].event_id == completed[0].event_id
    assert scheduled[0].not_before == T0 + timedelta(seconds=65)


def test_gce_terminate_after_migrate_completes_one_and_schedules_the_other() -> None:
    state, _ = gce({}, "maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE", T0)
    _, changes = gce(state, "maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE", T0 + timedelta(seconds=1))
    assert [(c.kind, c.status) for c in changes] == [
        (EventKind.LIVE_MIGRATE, EventStatus.COMPLETED),
        (EventKind.HOST_TERMINATE, EventStatus.SCHEDULED),
    ]


def test_gce_absent_maintenance_event_is_none() -> None:
    state, _ = gce({}, "maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE", T0)
    _, changes = gce(state, "maintenance-event", None, T0 + timedelta(seconds=70))
    assert [c.status for c in changes] == [EventStatus.COMPLETED]


UPCOMING = json.dumps(
    {
        "maintenanceType": "SCHEDULED",
        "canReschedule": "true",
        "maintenanceStatus": "PENDING",
        "windowStartTime": "2026-03-02T00:00:00Z",
        "windowEndTime": "2026-03-02T04:00:00Z",
    }
)


def test_gce_upcoming_maintenance_scheduled_started_completed() -> None:
    state, scheduled = gce({}, "upcoming-maintenance", UPCOMING, T0)
    ongoing = UPCOMING.replace("PENDING", "ONGOING")
    state, started = gce(state, "upcoming-maintenance", ongoing, T0 + timedelta(hours=12))
    _, completed = gce(state, "upcoming-maintenance", None, T0 + timedelta(hours=13))
    changes = scheduled + started + completed
    assert [c.status for c in changes] == [EventStatus.SCHEDULED, EventStatus.STARTED, EventStatus.COMPLETED]
    assert len({c.event_id for c in changes}) == 1
    assert changes[0].not_before == datetime(2026, 3, 2, tzinfo=timezone.utc)


def test_gce_rescheduled_window_cancels_the_old_notice() -> None:
    state, first = gce({}, "upcoming-maintenance", UPCOMING, T0)
    moved = UPCOMING.replace("2026-03-02T00", "2026-03-05T00")
    _, changes = gce(state, "upcoming-maintenance", moved, T0 + timedelta(hours=1))
    assert [c.status for c in changes] == [EventStatus.CANCELED, EventStatus.SCHEDULED]
    assert changes[0].event_id == first[0].event_id
    assert changes[1].event_id != first[0].event_id


def test_gce_other_upcoming_field_changes_are_state_only() -> None:
    state, _ = gce({}, "upcoming-maintenance", UPCOMING, T0)
    _, changes = gce(state, "upcoming-maintenance", UPCOMING.replace("04:00", "05:00"), T0 + timedelta(hours=1))
    assert changes == []


def test_gce_preempted_is_started_once() -> None:
    state, none = gce({}, "preempted", "FALSE", T0)
    state, preempted = gce(state, "preempted", "TRUE", T0 + timedelta(seconds=1))
    _, again = gce(state, "preempted", "TRUE", T0 + timedelta(seconds=2))
    assert none == []
    assert again == []
    assert [(c.kind, c.status) for c in preempted] == [(EventKind.PREEMPT, EventStatus.STARTED)]


def test_gce_state_round_trips_and_keeps_the_event_id_across_a_restart() -> None:
    state, scheduled = gce({}, "maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE", T0)
    restored = gce_state_from_json(json.loads(json.dumps(gce_state_to_json(state))))
    _, completed = gce(restored, "maintenance-event", "NONE", T0 + timedelta(minutes=2))
    assert completed[0].event_id == scheduled[0].event_id


def test_malformed_gce_value_raises_and_leaves_state_to_the_caller() -> None:
    with pytest.raises(MalformedDocumentError):
        gce({}, "maintenance-event", "MIGRATE_ON_HOST_MAINTEN\x00", T0)


def test_gce_a_maintenance_value_google_added_is_scheduled_then_completed_as_unknown() -> None:
    # GIVEN a value this release does not know, then NONE again
    state, scheduled = gce({}, "maintenance-event", "SUSPEND_ON_HOST_MAINTENANCE", T0)
    _, completed = gce(state, "maintenance-event", "NONE", T0 + timedelta(minutes=3))

    # THEN it is reported as a maintenance of kind unknown, with one id from start to end
    assert [(c.kind, c.status) for c in scheduled + completed] == [
        (EventKind.UNKNOWN, EventStatus.SCHEDULED),
        (EventKind.UNKNOWN, EventStatus.COMPLETED),
    ]
    assert scheduled[0].event_id == completed[0].event_id


@pytest.mark.parametrize("value", ["MIGRATE_ON_HOST_MAINTENANCE", "SUSPEND_ON_HOST_MAINTENANCE"])
def test_gce_a_restart_mid_maintenance_reports_no_second_scheduled(value: str) -> None:
    # GIVEN an agent that saw a maintenance begin and was restarted while it lasted
    state, scheduled = gce({}, "maintenance-event", value, T0)

    # WHEN the restarted agent reads the same value again, then NONE
    state, again = gce(restarted_gce(state), "maintenance-event", value, T0 + timedelta(seconds=30), etag="f")
    _, completed = gce(state, "maintenance-event", "NONE", T0 + timedelta(seconds=90), etag="g")

    # THEN there is no second scheduled, and the completion carries the first id
    assert again == []
    assert [c.event_id for c in completed] == [scheduled[0].event_id]


def restarted_gce(state: dict[str, GceKeyState]) -> dict[str, GceKeyState]:
    return gce_state_from_json(json.loads(json.dumps(gce_state_to_json(state))))
