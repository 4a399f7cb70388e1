"""The committed JSON Schema of `data` and the codec agree on what is valid."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

import wire
from tests.fixtures import FIXTURES, fixture_json
from wire.envelope import event_from_data
from wire.errors import MalformedEnvelopeError

SCHEMAS = Path(wire.__file__).parent / "schemas"
EVENT_SCHEMA = json.loads((SCHEMAS / "maintenance-event-data.schema.json").read_text())
RESULT_SCHEMA = json.loads((SCHEMAS / "command-result-data.schema.json").read_text())


def test_schemas_are_valid_draft_2020_12() -> None:
    Draft202012Validator.check_schema(EVENT_SCHEMA)
    Draft202012Validator.check_schema(RESULT_SCHEMA)


@pytest.mark.parametrize("path", sorted((FIXTURES / "envelopes").glob("*.json")), ids=lambda p: p.stem)
def test_every_golden_envelope_data_validates(path: Path) -> None:
    Draft202012Validator(EVENT_SCHEMA).validate(json.loads(path.read_text())["data"])


def _data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = copy.deepcopy(fixture_json("envelopes/azure-live-migration-scheduled.json")["data"])
    for name, value in changes.items():
        if value is ...:
            del data[name]
        else:
            data[name] = value
    return data


@pytest.mark.parametrize(
    ("data", "valid"),
    [
        (_data(), True),
        (_data(not_before=None, duration_seconds=None, event_source=None), True),
        (_data(not_before="2022-04-11T22:26:58.250Z"), True),
        (_data(duration_seconds=-1), True),
        (_data(event_source="user"), True),
        (_data(cloud="gce", kind="live_migrate", resources=["WestNO_0"]), True),
        (_data(cloud="gce", kind="freeze"), False),
        (_data(kind="upcoming"), False),
        (_data(cloud="aws"), False),
        (_data(status="done"), False),
        (_data(schema_version=2), False),
        (_data(not_before="Mon, 11 Apr 2022 22:26:58 GMT"), False),
        (_data(duration_seconds="5"), False),
        (_data(resources=[1]), False),
        (_data(event_source="cosmic"), False),
        (_data(description=None), False),
        (_data(raw=[]), False),
        (_data(reporter=""), False),
        (_data(event_id=""), False),
        (_data(raw=...), False),
        (_data(sequence=...), False),
    ],
)
def test_schema_and_codec_agree(data: dict[str, Any], valid: bool) -> None:
    # GIVEN a data object, WHEN both the schema and the codec judge it, THEN they agree
    schema_says = Draft202012Validator(EVENT_SCHEMA).is_valid(data)
    try:
        event_from_data(data)
        codec_says = True
    except MalformedEnvelopeError:
        codec_says = False
    assert (schema_says, codec_says) == (valid, valid)


def test_command_result_schema_accepts_what_the_codec_writes() -> None:
    from wire.envelope import command_result_to_data
    from wire.model import CommandResult

    data = command_result_to_data(CommandResult("c1", True, "E1", "vm-0", "approved"))
    Draft202012Validator(RESULT_SCHEMA).validate(data)
