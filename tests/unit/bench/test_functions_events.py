"""The benchmarks' events: built through the product's own parser, so they are what an agent publishes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from bench.functions_events import completion, envelope_body, new_event_id, reboot_entry, reported_event
from wire.envelope import decode
from wire.model import Cloud, EventKind, EventSource, EventStatus, MaintenanceEvent

SEEN = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


def test_every_reporter_of_one_event_publishes_the_same_envelope_id() -> None:
    # GIVEN one platform Reboot of two VMs, seen by three
    entry = reboot_entry(new_event_id(), ["vm-0", "vm-1"], SEEN, source="Platform")

    # WHEN each reporter's agent builds its envelope, at its own moment
    envelopes = [
        decode(envelope_body(reported_event(entry, vm, incarnation=2), SEEN + timedelta(milliseconds=index)))
        for index, vm in enumerate(["vm-0", "vm-1", "vm-2"])
    ]

    # THEN the ids agree, the reporters differ, and only the VMs in Resources are concerned
    assert len({envelope.id for envelope in envelopes}) == 1
    events = [envelope.data for envelope in envelopes]
    assert all(isinstance(event, MaintenanceEvent) for event in events)
    assert [event.reporter for event in events if isinstance(event, MaintenanceEvent)] == ["vm-0", "vm-1", "vm-2"]
    assert [event.concerns_reporter for event in events if isinstance(event, MaintenanceEvent)] == [True, True, False]


def test_a_user_reboot_is_scheduled_with_fifteen_minutes_of_notice() -> None:
    event_id = new_event_id()

    event = reported_event(reboot_entry(event_id, ["vm-0"], SEEN, source="User"), "vm-0", incarnation=2)

    assert (event.cloud, event.kind, event.status) == (Cloud.AZURE, EventKind.REBOOT, EventStatus.SCHEDULED)
    assert event.event_source is EventSource.USER
    assert event.event_id == event_id
    assert event_id == event_id.upper()
    assert event.not_before == SEEN + timedelta(minutes=15)
    assert event.sequence == "2"


def test_a_completion_is_the_same_event_with_its_own_envelope_id() -> None:
    event = reported_event(reboot_entry(new_event_id(), ["vm-0"], SEEN, source="User"), "vm-0", incarnation=2)

    done = completion(event, incarnation=4)

    assert done.status is EventStatus.COMPLETED
    assert done.event_id == event.event_id
    assert decode(envelope_body(done, SEEN)).id != decode(envelope_body(event, SEEN)).id
