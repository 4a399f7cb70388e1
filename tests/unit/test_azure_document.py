"""Parsing Azure Scheduled Events documents, from the documented examples."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Callable

import pytest

from agent.sources.azure.document import (
    AzureEventStatus,
    AzureScheduledEvent,
    parse_scheduled_events,
    to_maintenance_event,
)
from tests.fixtures import fixture_json, fixture_text
from wire.errors import MalformedDocumentError
from wire.model import EventKind, EventSource, EventStatus

LIVE_MIGRATION_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"


def test_documented_live_migration_sequence_parses_with_one_event_id() -> None:
    # GIVEN the four documents of the documented live migration
    documents = [parse_scheduled_events(fixture_text(f"azure/live-migration-{n}.json")) for n in range(1, 5)]

    # THEN incarnations count up and the one event keeps its id from Scheduled to Started
    assert [d.incarnation for d in documents] == [1, 2, 3, 4]
    assert [len(d.events) for d in documents] == [0, 1, 1, 0]
    scheduled, started = documents[1].events[0], documents[2].events[0]
    assert scheduled.event_id == started.event_id == LIVE_MIGRATION_ID
    assert (scheduled.status, started.status) == (AzureEventStatus.SCHEDULED, AzureEventStatus.STARTED)
    assert scheduled.kind is EventKind.FREEZE
    assert scheduled.resources == ("WestNO_0", "WestNO_1")
    assert scheduled.not_before == datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc)
    assert started.not_before is None  # "Will be blank if the event has already started"
    assert scheduled.event_source is EventSource.PLATFORM
    assert scheduled.duration_seconds == 5
    assert scheduled.raw == fixture_json("azure/live-migration-2.json")["Events"][0]


def test_terminate_document_without_newer_fields_parses() -> None:
    # GIVEN the documented VMSS Terminate response (2019-01-01 fields only)
    document = parse_scheduled_events(fixture_text("azure/vmss-terminate.json"))

    # THEN absent fields are empty, not invented
    (event,) = document.events
    assert event.kind is EventKind.TERMINATE
    assert event.description == ""
    assert event.event_source is None
    assert event.duration_seconds is None


def test_mapping_to_the_shared_model_keeps_everything() -> None:
    # GIVEN the Scheduled live-migration event seen by WestNO_0
    (event,) = parse_scheduled_events(fixture_text("azure/live-migration-2.json")).events

    # WHEN it is mapped at the scheduled step
    mapped = to_maintenance_event(event, status=EventStatus.SCHEDULED, reporter="WestNO_0", sequence="2")

    # THEN the model carries every field and knows it concerns the reporter
    assert mapped.event_id == LIVE_MIGRATION_ID
    assert mapped.concerns_reporter
    assert mapped.sequence == "2"
    assert mapped.raw["EventType"] == "Freeze"
    other = to_maintenance_event(event, status=EventStatus.SCHEDULED, reporter="WestNO_7", sequence="2")
    assert not other.concerns_reporter


def test_event_ids_are_looked_up_case_insensitively() -> None:
    document = parse_scheduled_events(fixture_text("azure/live-migration-2.json"))
    assert LIVE_MIGRATION_ID.lower() in document.by_id()


def test_quoted_numbers_are_accepted() -> None:
    body = json.dumps({"DocumentIncarnation": "9", "Events": [_event(DurationInSeconds="-1")]})
    document = parse_scheduled_events(body)
    assert document.incarnation == 9
    assert document.events[0].duration_seconds == -1


@pytest.mark.parametrize("text", ["²", "٣", "--5", "-", "+5", "0x10", "1" * 19])
def test_a_quoted_number_is_ascii_decimal_and_no_longer_than_an_int64(text: str) -> None:
    body = json.dumps({"DocumentIncarnation": "9", "Events": [_event(DurationInSeconds=text)]})
    (event,) = parse_scheduled_events(body).events
    assert event.duration_seconds is None
    assert "must be an integer" in event.unreadable["DurationInSeconds"]


def _event(**overrides: object) -> dict[str, object]:
    event: dict[str, object] = {
        "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
        "EventStatus": "Scheduled",
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm-0"],
        "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "User",
        "DurationInSeconds": -1,
    }
    event.update(overrides)
    return event


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{not json", "not JSON"),
        ("[]", "JSON object"),
        ('{"Events": []}', "DocumentIncarnation is missing"),
        ('{"DocumentIncarnation": true, "Events": []}', "boolean"),
        ('{"DocumentIncarnation": 1}', "Events must be a list"),
    ],
)
def test_a_document_without_its_frame_is_refused_for_a_retry(body: str, message: str) -> None:
    # Only what makes the whole document unreadable is refused: the poller then reads it again.
    with pytest.raises(MalformedDocumentError, match=message):
        parse_scheduled_events(body)


def _document(*entries: object) -> str:
    return json.dumps({"DocumentIncarnation": 4, "Events": list(entries)})


def _only_readable(*odd: object) -> tuple[AzureScheduledEvent, ...]:
    """Parse a document of `odd` entries followed by one well-formed entry for this VM."""
    mine = _event(EventId="11111111-2222-3333-4444-555555555555", Resources=["me"])
    document = parse_scheduled_events(_document(*odd, mine))
    assert document.events[-1].event_id == mine["EventId"], "the well-formed entry is read whatever precedes it"
    assert document.events[-1].unreadable == {}
    return document.events[:-1]


@pytest.mark.parametrize(
    ("overrides", "field", "check"),
    [
        ({"EventType": "Hibernate"}, "EventType", lambda e: e.kind is EventKind.UNKNOWN),
        ({"EventType": None}, "EventType", lambda e: e.kind is EventKind.UNKNOWN),
        ({"EventStatus": "Completed"}, "EventStatus", lambda e: e.status is AzureEventStatus.UNKNOWN),
        ({"EventSource": "Cosmic"}, "EventSource", lambda e: e.event_source is None),
        ({"NotBefore": "tomorrow"}, "NotBefore", lambda e: e.not_before is None),
        ({"NotBefore": 1700000000}, "NotBefore", lambda e: e.not_before is None),
        ({"Resources": "vm-0"}, "Resources", lambda e: e.resources == ()),
        ({"Resources": ["vm-0", 7, None]}, "Resources", lambda e: e.resources == ("vm-0",)),
        ({"DurationInSeconds": "long"}, "DurationInSeconds", lambda e: e.duration_seconds is None),
        ({"Description": ["a", "b"]}, "Description", lambda e: e.description == ""),
    ],
)
def test_an_entry_that_cannot_be_fully_read_is_kept_with_what_can_be_read(
    overrides: dict[str, object], field: str, check: Callable[[AzureScheduledEvent], bool]
) -> None:
    # GIVEN a document whose first entry has one field the parser does not understand
    entry = _event(**overrides)

    # WHEN it is parsed
    (odd,) = _only_readable(entry)

    # THEN that entry is still there, with the field marked unreadable, the rest read, and the raw entry kept
    assert check(odd)
    assert list(odd.unreadable) == [field]
    assert odd.event_id == entry["EventId"]
    assert odd.raw == entry


@pytest.mark.parametrize(
    "entry",
    [
        "not an object",
        7,
        _event(EventId=""),
        _event(EventId=None),
        _event(EventId=["x"]),
        {"EventType": "Reboot"},
    ],
)
def test_an_entry_without_an_event_id_is_left_out_and_the_others_are_read(entry: object) -> None:
    # An entry without an EventId cannot be followed from one document to the next, nor approved.
    assert _only_readable(entry) == ()


def test_a_repeated_event_id_keeps_the_first_entry() -> None:
    first = _event(EventStatus="Scheduled")
    document = parse_scheduled_events(_document(first, _event(EventStatus="Started")))
    assert [e.status for e in document.events] == [AzureEventStatus.SCHEDULED]


@pytest.mark.parametrize(
    ("field", "sent", "read"),
    [
        ("EventType", "REBOOT", EventKind.REBOOT),
        ("EventType", "freeze", EventKind.FREEZE),
        ("EventType", " Terminate ", EventKind.TERMINATE),
        ("EventStatus", "scheduled", AzureEventStatus.SCHEDULED),
        ("EventStatus", "STARTED", AzureEventStatus.STARTED),
        ("EventSource", "PLATFORM", EventSource.PLATFORM),
        ("EventSource", "user", EventSource.USER),
    ],
)
def test_enums_are_read_in_any_casing(field: str, sent: str, read: object) -> None:
    (event,) = parse_scheduled_events(_document(_event(**{field: sent}))).events
    assert read in (event.kind, event.status, event.event_source)
    assert event.unreadable == {}


@pytest.mark.parametrize(
    "text",
    [
        "Mon, 19 Sep 2016 18:29:47 GMT",
        "2016-09-19T18:29:47Z",
        "2016-09-19T18:29:47.000Z",
        "2016-09-19T20:29:47+02:00",
        "2016-09-19T18:29:47.0000000Z",
        "2016-09-19T18:29:47",
        "2016-09-19 18:29:47Z",
    ],
)
def test_not_before_is_read_as_rfc_1123_or_iso_8601(text: str) -> None:
    # Azure prints RFC 1123; some IMDS emulators print ISO 8601 (a time without a zone is UTC).
    (event,) = parse_scheduled_events(_document(_event(NotBefore=text))).events
    assert event.not_before == datetime(2016, 9, 19, 18, 29, 47, tzinfo=timezone.utc)
    assert event.unreadable == {}


def test_an_unreadable_field_is_carried_into_the_event_model() -> None:
    (event,) = parse_scheduled_events(_document(_event(EventType="Hibernate", NotBefore="soon"))).events
    mapped = to_maintenance_event(event, status=EventStatus.SCHEDULED, reporter="vm-0", sequence="4")
    assert mapped.kind is EventKind.UNKNOWN
    assert mapped.not_before is None
    assert mapped.unreadable == ("EventType", "NotBefore")
    assert mapped.raw["NotBefore"] == "soon"
