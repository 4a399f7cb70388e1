"""The CloudEvents envelope of docs/contracts.md#envelope: deterministic ids, golden output, strict decoding."""

from __future__ import annotations

import copy
import hashlib
import json
from datetime import timedelta
from typing import Any

import pytest

from tests.factories import OBSERVED_AT, azure_event
from tests.fixtures import FIXTURES, fixture_json
from tests.golden import golden_envelopes
from wire.envelope import (
    decode,
    encode,
    envelope_for_command_result,
    envelope_for_event,
    event_envelope_id,
    to_cloudevent,
)
from wire.errors import MalformedEnvelopeError
from wire.model import Cloud, CommandResult, EventStatus, MaintenanceEvent

GOLDEN_NAMES = sorted(path.stem for path in (FIXTURES / "envelopes").glob("*.json"))


def test_id_is_sha256_of_cloud_event_id_status_with_azure_id_lowercased() -> None:
    # GIVEN the documented EventId in upper case
    expected = hashlib.sha256(b"azure|c7061bac-afdc-4513-b24b-aa5f13a16123|scheduled").hexdigest()

    # THEN either case yields the same id, so every reporter agrees
    assert event_envelope_id(Cloud.AZURE, "C7061BAC-AFDC-4513-B24B-AA5F13A16123", EventStatus.SCHEDULED) == expected
    assert event_envelope_id(Cloud.AZURE, "c7061bac-afdc-4513-b24b-aa5f13a16123", EventStatus.SCHEDULED) == expected


def test_every_reporter_and_every_restart_yields_the_same_id() -> None:
    # GIVEN the same event seen by two VMs of the availability set, at different moments
    first = envelope_for_event(azure_event(reporter="WestNO_0", sequence="2"), OBSERVED_AT)
    second = envelope_for_event(azure_event(reporter="WestNO_1", sequence="5"), OBSERVED_AT + timedelta(seconds=3))

    # THEN the ids are equal; only the status makes a new id
    assert first.id == second.id
    started = envelope_for_event(azure_event(status=EventStatus.STARTED), OBSERVED_AT)
    assert started.id != first.id


def test_golden_envelopes_match_the_recorded_files() -> None:
    # GIVEN the envelopes built from the recorded metadata documents
    built = golden_envelopes()

    # THEN each equals its committed golden file, and none is missing or extra
    assert sorted(built) == GOLDEN_NAMES
    for name, document in built.items():
        assert document == fixture_json(f"envelopes/{name}.json"), name


def test_golden_ids_follow_the_definition_independently() -> None:
    for name in GOLDEN_NAMES:
        document = fixture_json(f"envelopes/{name}.json")
        data = document["data"]
        event_id = data["event_id"].lower() if data["cloud"] == "azure" else data["event_id"]
        key = f"{data['cloud']}|{event_id}|{data['status']}".encode()
        assert document["id"] == hashlib.sha256(key).hexdigest(), name


def test_live_migration_keeps_one_event_id_across_three_envelopes() -> None:
    envelopes = [
        fixture_json(f"envelopes/azure-live-migration-{s}.json") for s in ("scheduled", "started", "completed")
    ]
    assert {e["data"]["event_id"] for e in envelopes} == {"C7061BAC-AFDC-4513-B24B-AA5F13A16123"}
    assert [e["type"].rsplit(".", 1)[1] for e in envelopes] == ["scheduled", "started", "completed"]
    assert len({e["id"] for e in envelopes}) == 3


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_decode_round_trips_every_golden_envelope(name: str) -> None:
    # GIVEN a golden envelope as bytes on a bus
    body = json.dumps(fixture_json(f"envelopes/{name}.json")).encode()

    # WHEN it is decoded and encoded again
    envelope = decode(body)

    # THEN nothing is lost
    assert isinstance(envelope.data, MaintenanceEvent)
    assert json.loads(encode(envelope)) == fixture_json(f"envelopes/{name}.json")


def test_extension_attributes_are_kept() -> None:
    document = fixture_json("envelopes/azure-live-migration-scheduled.json")
    document["attestation"] = "eyJhbGciOi"
    document["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    envelope = decode(document)
    assert envelope.extensions == {
        "attestation": "eyJhbGciOi",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }
    assert to_cloudevent(envelope)["attestation"] == "eyJhbGciOi"


def test_unknown_data_fields_are_ignored_for_forward_compatibility() -> None:
    document = fixture_json("envelopes/azure-live-migration-scheduled.json")
    document["data"]["added_in_a_later_release"] = True
    assert isinstance(decode(document).data, MaintenanceEvent)


def test_command_results_round_trip_with_their_own_id() -> None:
    result = CommandResult(command_id="cmd-1", accepted=False, event_id="E1", target="vm-0", reason="expired")
    envelope = envelope_for_command_result(result, Cloud.AZURE, OBSERVED_AT)
    assert envelope.id == hashlib.sha256(b"cmd-1|rejected").hexdigest()
    assert envelope.type == "org.maintenancebridge.command.rejected"
    decoded = decode(encode(envelope))
    assert decoded.data == result


def _golden() -> dict[str, Any]:
    document: dict[str, Any] = fixture_json("envelopes/azure-live-migration-scheduled.json")
    return document


def _with(path: str, value: Any) -> dict[str, Any]:
    """The golden scheduled envelope with one field changed (path like 'data.kind'); `...` deletes it."""
    document = copy.deepcopy(_golden())
    *parents, last = path.split(".")
    target = document
    for part in parents:
        target = target[part]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return document


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"{", "not UTF-8 JSON"),
        (b"[1]", "JSON object"),
        (_with("specversion", "0.3"), "specversion"),
        (_with("id", ...), "id is required"),
        (_with("id", "ABC"), "64 lowercase hex"),
        (_with("id", "0" * 64), "does not match its data"),
        (_with("source", "/azure/someone-else"), "source"),
        (_with("type", "com.example.other"), "is not ours"),
        (_with("type", "org.maintenancebridge.maintenance.started"), "type"),
        (_with("subject", "other"), "subject"),
        (_with("time", "yesterday"), "RFC 3339"),
        (_with("datacontenttype", "text/plain"), "datacontenttype"),
        (_with("data", "text"), "data must be a JSON object"),
        (_with("Bad-Name", "x"), "extension name"),
        (_with("trace", {"nested": 1}), "string, integer or boolean"),
        (_with("data.schema_version", 2), "upgrade maintenance-bridge"),
        (_with("data.schema_version", "1"), "schema_version must be an integer"),
        (_with("data.cloud", "aws"), "data.cloud must be one of azure, gce"),
        (_with("data.kind", "live_migrate"), "does not exist on azure"),
        (_with("data.kind", "nap"), "data.kind"),
        (_with("data.status", "done"), "data.status"),
        (_with("data.event_id", ""), "data.event_id"),
        (_with("data.reporter", ...), "data.reporter"),
        (_with("data.not_before", 5), "not_before"),
        (_with("data.not_before", "Mon, 11 Apr 2022 22:26:58 GMT"), "RFC 3339"),
        (_with("data.duration_seconds", True), "duration_seconds"),
        (_with("data.resources", "WestNO_0"), "resources"),
        (_with("data.concerns_reporter", False), "concerns_reporter"),
        (_with("data.event_source", "cosmic"), "event_source"),
        (_with("data.description", None), "description"),
        (_with("data.raw", []), "raw"),
    ],
)
def test_decode_refuses_bad_input_with_a_clear_message(body: Any, message: str) -> None:
    with pytest.raises(MalformedEnvelopeError, match=message):
        decode(body)
