"""The lifecycle diff of design §3.2, as a table of before/after documents and values."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from agent.diff import (
    GceIdentity,
    GceKeyState,
    azure_state_from_json,
    azure_state_to_json,
    diff_azure,
    diff_gce,
    gce_state_from_json,
    gce_state_to_json,
)
from functions.core.azure_document import ScheduledEventsDocument, parse_scheduled_events
from functions.core.errors import MalformedDocumentError
from functions.core.model import EventKind, EventStatus
from tests.fixtures import fixture_text

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
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
        "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT" if status == "Scheduled" else "",
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    base.update(fields)
    return base


def statuses(changes: list[Any]) -> list[tuple[str, str]]:
    return [(c.event_id, c.status.value) for c in changes]


def test_documented_live_migration_yields_scheduled_started_completed() -> None:
    # GIVEN the four documented documents, seen one after the other by WestNO_0
    state: dict[str, Any] = {}
    seen = []
    for n in range(1, 5):
        state, changes = diff_azure(
            state, parse_scheduled_events(fixture_text(f"azure/live-migration-{n}.json")), reporter="WestNO_0"
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
        # Azure cancels by removing a Scheduled event
        ([event()], [], [("E1", "canceled")]),
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
    state, _ = diff_azure({}, doc(1, *before), reporter="vm-0")
    _, changes = diff_azure(state, doc(2, *after), reporter="vm-0")
    assert statuses(changes) == expected


def test_events_of_other_vms_are_forwarded_with_concerns_reporter_false() -> None:
    _, changes = diff_azure({}, doc(2, event(Resources=["vm-7"])), reporter="vm-0")
    assert len(changes) == 1
    assert not changes[0].concerns_reporter


def test_azure_state_survives_json_round_trip_so_a_restart_still_sees_completion() -> None:
    # GIVEN a Started event, saved as JSON and restored (an agent restart)
    state, _ = diff_azure({}, doc(3, event(status="Started")), reporter="vm-0")
    restored = azure_state_from_json(json.loads(json.dumps(azure_state_to_json(state))))

    # WHEN the event is gone in the next document
    _, changes = diff_azure(restored, doc(4), reporter="vm-0")

    # THEN the completion is detected
    assert statuses(changes) == [("E1", "completed")]


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
