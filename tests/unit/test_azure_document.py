"""Parsing Azure Scheduled Events documents, from the documented examples."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from functions.core.azure_document import AzureEventStatus, parse_scheduled_events, to_maintenance_event
from functions.core.errors import MalformedDocumentError
from functions.core.model import EventKind, EventSource, EventStatus
from tests.fixtures import fixture_json, fixture_text

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
    with pytest.raises(MalformedDocumentError, match="DurationInSeconds must be an integer"):
        parse_scheduled_events(body)


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
        (json.dumps({"DocumentIncarnation": 1, "Events": ["x"]}), "Events[0] must be an object"),
        (json.dumps({"DocumentIncarnation": 1, "Events": [_event(EventId="")]}), "Events[0].EventId"),
        (
            json.dumps({"DocumentIncarnation": 1, "Events": [_event(EventType="Nap")]}),
            "upgrade maintenance-bridge",
        ),
        (
            json.dumps({"DocumentIncarnation": 1, "Events": [_event(EventStatus="Done")]}),
            "Scheduled or Started",
        ),
        (json.dumps({"DocumentIncarnation": 1, "Events": [_event(Resources="vm-0")]}), "Resources"),
        (json.dumps({"DocumentIncarnation": 1, "Events": [_event(NotBefore="tomorrow")]}), "RFC 1123"),
        (
            json.dumps({"DocumentIncarnation": 1, "Events": [_event(EventSource="Cosmic")]}),
            "Platform or User",
        ),
        (json.dumps({"DocumentIncarnation": 1, "Events": [_event(DurationInSeconds="long")]}), "integer"),
        (json.dumps({"DocumentIncarnation": 1, "Events": [_event(), _event()]}), "appears twice"),
    ],
)
def test_malformed_documents_are_refused_with_a_message_naming_the_problem(body: str, message: str) -> None:
    with pytest.raises(MalformedDocumentError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_scheduled_events(body)
