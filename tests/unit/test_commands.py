"""The command codec (docs/contracts.md#commands): round trips, canonical bytes, strict refusal of anything else."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from wire.commands import (
    DEFAULT_TTL,
    Command,
    CommandType,
    MalformedCommandError,
    canonical_bytes,
    decode_command,
    encode_command,
    new_command,
)
from wire.tracecontext import TRACEPARENT, TRACESTATE, TraceContext

ISSUED = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
_ABSENT = object()  # an override that removes the field


def wire(**overrides: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "command_id": "0f8e3c2a5b6d4e7f9a1b2c3d4e5f6a7b",
        "type": "approve",
        "target": "WestNO_0",
        "event_id": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
        "issued_at": "2024-05-01T12:00:00Z",
        "expires_at": "2024-05-01T12:10:00Z",
    }
    for name, value in overrides.items():
        if value is _ABSENT:
            document.pop(name, None)
        else:
            document[name] = value
    return document


def body(**overrides: Any) -> bytes:
    return json.dumps(wire(**overrides)).encode("utf-8")


def test_new_command_has_uuid4_hex_id_and_expires_ten_minutes_after_issue() -> None:
    # WHEN a command is created without an expiry
    command = new_command(CommandType.DRAIN, target="vm-0", event_id="E1", issued_at=ISSUED)

    # THEN it expires DEFAULT_TTL (10 min) after issue and has a fresh 32-hex id
    assert command.expires_at == ISSUED + timedelta(minutes=10) == ISSUED + DEFAULT_TTL
    assert len(command.command_id) == 32
    assert int(command.command_id, 16) >= 0
    assert new_command(CommandType.DRAIN, target="vm-0", event_id="E1", issued_at=ISSUED).command_id != (
        command.command_id
    )


def test_round_trip_keeps_every_field() -> None:
    # GIVEN a command with every field, including a sub-millisecond time (the wire keeps milliseconds)
    command = new_command(
        CommandType.APPROVE,
        target="WestNO_0",
        event_id="C7061BAC-AFDC-4513-B24B-AA5F13A16123",
        issued_at=ISSUED + timedelta(microseconds=123_456),
        execute_at=ISSUED + timedelta(seconds=30),
    ).with_signature("c2lnbmF0dXJl")

    # WHEN it is encoded and decoded
    received = decode_command(encode_command(command))

    # THEN it comes back equal, and the times are at millisecond precision
    assert received.command == command
    assert command.issued_at.microsecond == 123_000
    assert received.body == encode_command(command)


def test_optional_fields_are_absent_from_the_wire_when_unset() -> None:
    command = new_command(CommandType.RESTORE, target="vm-0", event_id="E1", issued_at=ISSUED)
    assert set(command.to_wire()) == {"command_id", "type", "target", "event_id", "issued_at", "expires_at"}


def test_null_optional_fields_read_as_absent() -> None:
    # GIVEN a sender that writes null for the optional fields
    received = decode_command(body(execute_at=None, signature=None))
    # THEN they are unset
    assert received.command.execute_at is None
    assert received.command.signature is None


def test_canonical_bytes_sort_keys_drop_signature_and_use_no_spaces() -> None:
    # GIVEN a signed command object with keys in arbitrary order and non-ASCII text
    document = {"type": "drain", "signature": "xyz", "target": "vm-ø", "command_id": "1"}

    # THEN the canonical form is the documented one, byte for byte
    assert canonical_bytes(document) == '{"command_id":"1","target":"vm-ø","type":"drain"}'.encode()


def test_canonical_bytes_come_from_the_received_object_not_the_dataclass() -> None:
    # GIVEN a command whose timestamps are written with an offset and microseconds (equal instants
    # to what the dataclass would write, but other text)
    document = wire(issued_at="2024-05-01T14:00:00.000001+02:00")

    # WHEN it is decoded
    received = decode_command(json.dumps(document).encode())

    # THEN the signed bytes are those of the object as received
    assert received.canonical == canonical_bytes(document)
    assert received.canonical != received.command.signing_bytes()
    assert received.digest == hashlib.sha256(received.canonical).hexdigest()


def test_digest_ignores_the_signature_and_json_layout() -> None:
    # GIVEN the same command, once compact and once pretty-printed with a signature
    compact = decode_command(body())
    pretty = decode_command(json.dumps(wire(signature="abc"), indent=2).encode())
    # THEN they have one content digest
    assert compact.digest == pretty.digest


def test_accepts_text_as_well_as_bytes() -> None:
    assert decode_command(body().decode()).command.command_id == wire()["command_id"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"{not json", "not UTF-8 JSON"),
        (b"[1, 2]", "a command is a JSON object, got list"),
        (b'{"command_id": "a", "command_id": "b"}', "field command_id appears twice"),
        (b"{" + b'"x": "' + b"a" * (64 * 1024) + b'"}', "a command is at most 65536"),
    ],
)
def test_refuses_bodies_that_are_not_one_json_object(raw: bytes, message: str) -> None:
    with pytest.raises(MalformedCommandError, match=message):
        decode_command(raw)


@pytest.mark.parametrize(
    "field", ["command_id", "type", "target", "event_id", "issued_at", "expires_at"], ids=lambda f: f"no-{f}"
)
def test_refuses_a_missing_required_field(field: str) -> None:
    # GIVEN a command without one required field (expires_at too: the default applies on creation only)
    with pytest.raises(MalformedCommandError, match=rf"^{field} is missing"):
        decode_command(body(**{field: _ABSENT}))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"type": "reboot"}, r"type must be one of approve, drain, restore, got 'reboot'"),
        ({"type": None}, r"type must be one of approve, drain, restore, got None"),
        ({"command_id": ""}, r"command_id must be a non-empty string"),
        ({"command_id": 42}, r"command_id must be a non-empty string, got 42"),
        ({"command_id": "x" * 129}, r"command_id is 129 characters; at most 128"),
        ({"command_id": "a\nb"}, r"command_id must not contain control characters"),
        ({"target": ["vm-0"]}, r"target must be a non-empty string"),
        ({"target": "w" * 81}, r"target is 81 characters; at most 80 \(no Azure or GCE VM name is longer\)"),
        ({"target": "vm\x1b0"}, r"target must not contain control characters"),
        ({"event_id": "E" * 129}, r"event_id is 129 characters; at most 128"),
        ({"event_id": ""}, r"event_id must be a non-empty string"),
        ({"issued_at": 1714564800}, r"issued_at must be a non-empty string"),
        ({"issued_at": "2024-05-01 noon"}, r"issued_at: '2024-05-01 noon' is not an RFC 3339 timestamp"),
        ({"expires_at": "2024-05-01T12:10:00"}, r"expires_at: .* is not an RFC 3339 timestamp"),
        ({"execute_at": "soon"}, r"execute_at: 'soon' is not an RFC 3339 timestamp"),
        ({"signature": ""}, r"signature must be a non-empty string"),
        ({"signature": 7}, r"signature must be a non-empty string"),
        ({"expires_at": "2024-05-01T12:00:00Z"}, r"expires_at \(2024-05-01T12:00:00Z\) must be after issued_at"),
        ({"expires_at": "2024-05-01T11:00:00Z"}, r"expires_at .* must be after issued_at"),
        ({"execute_at": "2024-05-01T12:10:01Z"}, r"execute_at \(2024-05-01T12:10:01Z\) is after expires_at"),
        ({"approved_by": "me"}, r"unknown field\(s\) approved_by"),
        ({"Signature": "abc", "extra": 1}, r"unknown field\(s\) Signature, extra"),
    ],
)
def test_refuses_a_field_of_the_wrong_type_or_value(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(MalformedCommandError, match=message):
        decode_command(body(**overrides))


def test_execute_at_equal_to_expires_at_is_allowed() -> None:
    received = decode_command(body(execute_at="2024-05-01T12:10:00Z"))
    assert received.command.execute_at == received.command.expires_at


def test_constructor_refuses_naive_times() -> None:
    with pytest.raises(MalformedCommandError, match="issued_at must be a timezone-aware datetime"):
        Command(
            command_id="1",
            type=CommandType.DRAIN,
            target="vm-0",
            event_id="E1",
            issued_at=datetime(2024, 5, 1, 12, 0),  # naive on purpose
            expires_at=ISSUED + DEFAULT_TTL,
        )


def test_constructor_refuses_a_target_it_could_not_encode() -> None:
    # GIVEN a target holding a lone surrogate (text no UTF-8 encoder takes)
    # WHEN a command is built for it
    # THEN it is refused then, not when it is encoded after the actions it depends on
    with pytest.raises(MalformedCommandError, match="target must be Unicode text"):
        new_command(CommandType.DRAIN, target="vm-\ud800", event_id="E1", issued_at=ISSUED)


def test_times_are_normalised_to_utc() -> None:
    # GIVEN times in another zone
    plus_two = timezone(timedelta(hours=2))
    command = new_command(
        CommandType.DRAIN, target="vm-0", event_id="E1", issued_at=datetime(2024, 5, 1, 14, 0, tzinfo=plus_two)
    )
    # THEN they are stored and written as UTC
    assert command.issued_at.tzinfo is timezone.utc
    assert command.to_wire()["issued_at"] == "2024-05-01T12:00:00Z"


def test_a_command_carries_its_trace_context_in_the_signed_body_and_reads_it_back() -> None:
    # GIVEN a command for a traced maintenance
    trace = TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01", "rojo=1")
    command = new_command(CommandType.APPROVE, target="vm-0", event_id="E1", issued_at=ISSUED, trace=trace)

    # WHEN it goes over the wire
    received = decode_command(encode_command(command))

    # THEN the trace comes back as sent, and the bytes a signature covers include it
    assert received.command == command
    assert received.trace_problem is None
    assert json.loads(received.canonical)[TRACEPARENT] == trace.traceparent
    assert json.loads(received.canonical)[TRACESTATE] == "rojo=1"


@pytest.mark.parametrize("traceparent", ["00-nonsense", 7, None, "00-" + "0" * 32 + "-00f067aa0ba902b7-01"])
def test_a_trace_context_that_is_not_one_is_ignored_not_refused(traceparent: object) -> None:
    received = decode_command(body(traceparent=traceparent))
    assert received.command.trace is None
    assert received.trace_problem is not None
    # still covered as received: a verifier checks the bytes that were signed
    assert json.loads(received.canonical)[TRACEPARENT] == traceparent
