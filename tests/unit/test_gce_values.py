"""Parsing GCE metadata values and building their events (docs/contracts.md#gce-events)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from agent.sources.gce.values import (
    MaintenanceValue,
    maintenance_event,
    parse_maintenance_event,
    parse_preempted,
    parse_upcoming_maintenance,
    preempted_event,
    upcoming_event,
)
from tests.fixtures import fixture_text
from wire.errors import MalformedDocumentError
from wire.gce_ids import gce_event_id
from wire.model import EventKind, EventStatus

OBSERVED = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("gce/maintenance-event-none.txt", MaintenanceValue.NONE),
        ("gce/maintenance-event-migrate.txt", MaintenanceValue.MIGRATE_ON_HOST_MAINTENANCE),
        ("gce/maintenance-event-terminate.txt", MaintenanceValue.TERMINATE_ON_HOST_MAINTENANCE),
    ],
)
def test_documented_maintenance_event_values(fixture: str, expected: MaintenanceValue) -> None:
    assert parse_maintenance_event(fixture_text(fixture)) == expected.value
    assert parse_maintenance_event(fixture_text(fixture).encode() + b"\n") == expected.value


def test_a_maintenance_value_google_added_is_read_as_a_value() -> None:
    # GCE metadata is unversioned and Google may add values: a new one is a maintenance, not an error.
    assert parse_maintenance_event("MAYBE_LATER") == "MAYBE_LATER"
    assert parse_maintenance_event(b"migrate_on_host_maintenance\n") == "MIGRATE_ON_HOST_MAINTENANCE"


@pytest.mark.parametrize("garbled", [b"\x00\xff<garbage>\x13", "", "MIGRATE ON HOST", '"NO', "X" * 65, "NONE\x00"])
def test_a_garbled_maintenance_answer_is_refused_for_a_retry(garbled: str | bytes) -> None:
    with pytest.raises(MalformedDocumentError, match=r"will retry|not UTF-8"):
        parse_maintenance_event(garbled)


SCHEDULED_BY_GCE_VM_0: dict[str, Any] = {
    "status": EventStatus.SCHEDULED,
    "instance_id": "1",
    "reporter": "gce-vm-0",
    "first_observed": datetime(2026, 3, 1, tzinfo=timezone.utc),
    "sequence": "e",
}


def test_an_undocumented_maintenance_value_is_a_maintenance_of_kind_unknown() -> None:
    event = maintenance_event(value="SUSPEND_ON_HOST_MAINTENANCE", **SCHEDULED_BY_GCE_VM_0)
    assert (event.kind, event.not_before, event.unreadable) == (EventKind.UNKNOWN, None, ("value",))
    assert event.raw == {"key": "maintenance-event", "value": "SUSPEND_ON_HOST_MAINTENANCE"}


def test_preempted_values() -> None:
    assert parse_preempted(fixture_text("gce/preempted-true.txt")) is True
    assert parse_preempted(fixture_text("gce/preempted-false.txt")) is False
    with pytest.raises(MalformedDocumentError, match="TRUE or FALSE"):
        parse_preempted("yes")


def test_upcoming_maintenance_with_boolean_sent_as_string() -> None:
    # GIVEN the documented example (as valid JSON), canReschedule being the string "true"
    upcoming = parse_upcoming_maintenance(fixture_text("gce/upcoming-maintenance.json"))

    # THEN it parses to typed values
    assert upcoming.can_reschedule is True
    assert upcoming.status == "PENDING"
    assert not upcoming.ongoing
    assert upcoming.maintenance_type == "SCHEDULED"
    assert upcoming.window_start == datetime(2025, 8, 28, 21, 56, 26, tzinfo=timezone.utc)
    assert upcoming.window_end == datetime(2025, 8, 29, 1, 56, 20, tzinfo=timezone.utc)
    assert upcoming.anchor == "2025-08-28T21:56:26Z"


@pytest.mark.parametrize(("sent", "parsed"), [(True, True), (False, False), ("FALSE", False), (" true ", True)])
def test_can_reschedule_booleans_in_either_form(sent: object, parsed: bool) -> None:
    assert parse_upcoming_maintenance(f'{{"canReschedule": {_json(sent)}}}').can_reschedule is parsed


def _json(value: object) -> str:
    import json

    return json.dumps(value)


def test_upcoming_maintenance_as_printed_in_the_doc_is_refused_clearly() -> None:
    # The reference page prints the example without commas: that is not JSON.
    with pytest.raises(MalformedDocumentError, match="not JSON"):
        parse_upcoming_maintenance(fixture_text("gce/upcoming-maintenance-as-documented.txt"))


def test_upcoming_maintenance_that_is_not_an_object_is_refused_for_a_retry() -> None:
    with pytest.raises(MalformedDocumentError, match="JSON object"):
        parse_upcoming_maintenance('"PENDING"')


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"canReschedule": "perhaps"}', "canReschedule"),
        ('{"windowStartTime": "soon"}', "windowStartTime"),
        ('{"maintenanceStatus": 3}', "maintenanceStatus"),
        ('{"windowEndTime": {"at": 1}}', "windowEndTime"),
    ],
)
def test_an_upcoming_field_that_cannot_be_read_is_left_empty_and_named(body: str, field: str) -> None:
    upcoming = parse_upcoming_maintenance(body)
    assert list(upcoming.unreadable) == [field]
    assert upcoming.raw == json.loads(body)


def test_an_upcoming_notice_without_a_readable_window_is_still_an_event() -> None:
    upcoming = parse_upcoming_maintenance('{"maintenanceType": "SCHEDULED", "windowStartTime": "soon"}')
    event = upcoming_event(upcoming=upcoming, **SCHEDULED_BY_GCE_VM_0)
    assert (event.kind, event.not_before, event.unreadable) == (EventKind.UPCOMING, None, ("windowStartTime",))


def test_live_migration_event_has_a_stable_id_and_60_seconds_notice() -> None:
    # GIVEN a MIGRATE value first observed at OBSERVED
    scheduled = maintenance_event(
        value=MaintenanceValue.MIGRATE_ON_HOST_MAINTENANCE,
        status=EventStatus.SCHEDULED,
        instance_id="1234567890123456789",
        reporter="gce-vm-0",
        first_observed=OBSERVED,
        sequence="etag1",
    )
    # WHEN the value returns to NONE and the completion is built from the persisted first-observed time
    completed = maintenance_event(
        value=MaintenanceValue.MIGRATE_ON_HOST_MAINTENANCE,
        status=EventStatus.COMPLETED,
        instance_id="1234567890123456789",
        reporter="gce-vm-0",
        first_observed=OBSERVED,
        sequence="etag2",
    )

    # THEN both carry the derived id of docs/contracts.md#deterministic-ids
    assert scheduled.event_id == completed.event_id
    assert scheduled.event_id == gce_event_id("1234567890123456789", "maintenance-event", "2026-03-01T12:00:00Z")
    assert scheduled.kind is EventKind.LIVE_MIGRATE
    assert scheduled.not_before == OBSERVED + timedelta(seconds=60)
    assert scheduled.resources == ("gce-vm-0",)
    assert scheduled.concerns_reporter


def test_host_terminate_has_60_minutes_notice() -> None:
    event = maintenance_event(
        value=MaintenanceValue.TERMINATE_ON_HOST_MAINTENANCE,
        status=EventStatus.SCHEDULED,
        instance_id="1",
        reporter="gpu-vm",
        first_observed=OBSERVED,
        sequence="e",
    )
    assert event.kind is EventKind.HOST_TERMINATE
    assert event.not_before == OBSERVED + timedelta(minutes=60)


def test_none_is_not_an_event() -> None:
    with pytest.raises(ValueError, match="NONE"):
        maintenance_event(
            value=MaintenanceValue.NONE,
            status=EventStatus.SCHEDULED,
            instance_id="1",
            reporter="vm",
            first_observed=OBSERVED,
            sequence="e",
        )


def test_upcoming_event_id_is_anchored_on_the_window_not_the_observation() -> None:
    upcoming = parse_upcoming_maintenance(fixture_text("gce/upcoming-maintenance.json"))
    first = upcoming_event(
        upcoming=upcoming,
        status=EventStatus.SCHEDULED,
        instance_id="1",
        reporter="c3-vm",
        first_observed=OBSERVED,
        sequence="a",
    )
    later = upcoming_event(
        upcoming=upcoming,
        status=EventStatus.SCHEDULED,
        instance_id="1",
        reporter="c3-vm",
        first_observed=OBSERVED + timedelta(hours=5),
        sequence="b",
    )
    assert first.event_id == later.event_id
    assert first.kind is EventKind.UPCOMING
    assert first.not_before == upcoming.window_start
    assert first.raw["value"]["canReschedule"] == "true"


def test_preempted_event_is_started_at_once() -> None:
    event = preempted_event(instance_id="1", reporter="spot-vm", first_observed=OBSERVED, sequence="x")
    assert (event.kind, event.status) == (EventKind.PREEMPT, EventStatus.STARTED)
