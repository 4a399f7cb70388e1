"""Commands from the functions (or an operator) to one agent: the model and its strict codec.

See docs/contracts.md#commands. A command asks one VM's agent to approve an Azure scheduled event, or to drain or
restore its `/readyz`. Commands are security-sensitive: the decoder refuses anything it does not
fully understand (unknown fields included) and names the field, so a command is never half-read.

Signatures (wire/signing.py) cover the *canonical bytes* of the command as received:
the JSON object without `signature`, keys sorted, separators `,` and `:`, UTF-8. They are built
from the received object itself, never re-serialised through the dataclass, so what is verified
is exactly what was sent.

Standard library only: the agent and the functions both import this module.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any

from wire.errors import PermanentError
from wire.jsontext import load_json
from wire.model import JsonObject
from wire.timefmt import format_rfc3339, parse_rfc3339
from wire.tracecontext import TRACEPARENT, TRACESTATE, TraceContext, received

DEFAULT_TTL = timedelta(minutes=10)
# The command_id becomes a Service Bus MessageId, whose limit is 128 characters.
MAX_COMMAND_ID_LENGTH = 128
# The target is a VM name: Azure allows 64 characters (15 on Windows), and a scale set's instance
# is named after its set plus "_<instance id>"; GCE allows 63. It becomes a Service Bus SessionId
# (at most 128) and a Pub/Sub attribute and ordering key (at most 1,024 bytes).
MAX_TARGET_LENGTH = 80
# An Azure EventId is a GUID (36 characters), a GCE event id a SHA-256 in hex (64).
MAX_EVENT_ID_LENGTH = 128
# A command is a handful of short strings; anything much larger is not one of ours.
MAX_COMMAND_BYTES = 64 * 1024
# C0 controls and DEL: never part of an id, a VM name or an event id.
_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

REQUIRED_FIELDS = ("command_id", "type", "target", "event_id", "issued_at", "expires_at")
# The trace context of the maintenance the command is for (wire/tracecontext.py) is inside the
# signed body: a command's trace is the sender's word like the rest of it. Agents older than it
# refuse the fields (unknown fields are), so senders add them only for an agent whose report
# carried a trace context (docs/contracts.md#trace-context).
OPTIONAL_FIELDS = ("execute_at", "signature", TRACEPARENT, TRACESTATE)
KNOWN_FIELDS = frozenset(REQUIRED_FIELDS + OPTIONAL_FIELDS)


class MalformedCommandError(PermanentError):
    """A command that is not what docs/contracts.md#command-fields defines; the message names the field."""


class CommandType(str, Enum):
    APPROVE = "approve"
    DRAIN = "drain"
    RESTORE = "restore"


@dataclass(frozen=True)
class Command:
    """One command for one VM.

    Times are aware UTC datetimes at millisecond precision (the wire precision), so a command
    survives an encode/decode round trip unchanged. `signature` is base64url text, or None.
    """

    command_id: str
    type: CommandType
    target: str
    event_id: str
    issued_at: datetime
    expires_at: datetime
    execute_at: datetime | None = None
    signature: str | None = None
    # Never a reason to carry out or refuse a command: only a label for its records and log lines.
    trace: TraceContext | None = None

    def __post_init__(self) -> None:
        _check_text(self.command_id, "command_id", MAX_COMMAND_ID_LENGTH, "it becomes a bus message id")
        check_target(self.target)
        check_event_id(self.event_id)
        for name in ("issued_at", "expires_at", "execute_at"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _wire_precision(value, name))
        if self.expires_at <= self.issued_at:
            raise MalformedCommandError(
                f"expires_at ({format_rfc3339(self.expires_at)}) must be after issued_at "
                f"({format_rfc3339(self.issued_at)})"
            )
        if self.execute_at is not None and self.execute_at > self.expires_at:
            raise MalformedCommandError(
                f"execute_at ({format_rfc3339(self.execute_at)}) is after expires_at "
                f"({format_rfc3339(self.expires_at)}): the command would expire before it could run"
            )

    def to_wire(self) -> JsonObject:
        """The JSON object of this command; optional fields appear only when set."""
        document: JsonObject = {
            "command_id": self.command_id,
            "type": self.type.value,
            "target": self.target,
            "event_id": self.event_id,
            "issued_at": format_rfc3339(self.issued_at),
            "expires_at": format_rfc3339(self.expires_at),
        }
        if self.execute_at is not None:
            document["execute_at"] = format_rfc3339(self.execute_at)
        if self.signature is not None:
            document["signature"] = self.signature
        if self.trace is not None:
            document.update(self.trace.attributes())
        return document

    def signing_bytes(self) -> bytes:
        """The canonical bytes a sender signs (the command without `signature`)."""
        return canonical_bytes(self.to_wire())

    def with_signature(self, signature: str) -> Command:
        return replace(self, signature=signature)


@dataclass(frozen=True)
class ReceivedCommand:
    """A decoded command plus the canonical bytes of the object exactly as received.

    `canonical` is what a signature is checked against; `digest` (SHA-256 of it) tells a replay
    (same content) from a reused command_id (different content).
    """

    command: Command
    canonical: bytes
    body: bytes
    # Why the trace context the command carries was ignored (not W3C's form), or None.
    trace_problem: str | None = None

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical).hexdigest()


def new_command(
    command_type: CommandType,
    *,
    target: str,
    event_id: str,
    issued_at: datetime,
    execute_at: datetime | None = None,
    expires_at: datetime | None = None,
    command_id: str | None = None,
    trace: TraceContext | None = None,
) -> Command:
    """A new command with a fresh uuid4-hex command_id; it expires `DEFAULT_TTL` after issue
    unless `expires_at` says otherwise."""
    return Command(
        command_id=command_id if command_id is not None else uuid.uuid4().hex,
        type=command_type,
        target=target,
        event_id=event_id,
        issued_at=issued_at,
        expires_at=expires_at if expires_at is not None else issued_at + DEFAULT_TTL,
        execute_at=execute_at,
        trace=trace,
    )


def encode_command(command: Command) -> bytes:
    """UTF-8 JSON bytes of the command, in canonical form (signature included when set)."""
    return json.dumps(command.to_wire(), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def canonical_bytes(document: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: the object without `signature`, keys sorted, no spaces, UTF-8."""
    unsigned = {key: value for key, value in document.items() if key != "signature"}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_command(body: bytes | str) -> ReceivedCommand:
    """Parse and validate one command message body.

    Raises:
        MalformedCommandError: not a JSON object, an unknown or missing field, a field of the
            wrong type, an unknown `type`, a timestamp that is not RFC 3339, expires_at not after
            issued_at, or execute_at after expires_at. The message names the field.
    """
    try:
        raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    except UnicodeEncodeError as exc:
        raise MalformedCommandError(f"the body is not valid Unicode text: {exc}") from exc
    document = load_command_object(raw)
    unknown = sorted(set(document) - KNOWN_FIELDS)
    if unknown:
        raise MalformedCommandError(
            f"unknown field(s) {', '.join(unknown)}: a command carries only {', '.join(sorted(KNOWN_FIELDS))} "
            "(unknown fields are refused because a command is security-sensitive)"
        )
    for name in REQUIRED_FIELDS:
        if name not in document:
            raise MalformedCommandError(f"{name} is missing: every command carries {', '.join(REQUIRED_FIELDS)}")
    # A trace context that is not one is ignored, not refused: a trace never decides whether a
    # command runs. The signature still covers it as received (`canonical`).
    trace, trace_problem = received(document)
    command = Command(
        command_id=_string(document, "command_id"),
        type=_command_type(document),
        target=_string(document, "target"),
        event_id=_string(document, "event_id"),
        issued_at=_timestamp(document, "issued_at"),
        expires_at=_timestamp(document, "expires_at"),
        execute_at=_optional_timestamp(document, "execute_at"),
        signature=_optional_string(document, "signature"),
        trace=trace,
    )
    return ReceivedCommand(command=command, canonical=canonical_bytes(document), body=raw, trace_problem=trace_problem)


def load_command_object(raw: bytes) -> dict[str, Any]:
    """The JSON object of a message body, refusing duplicate keys (two `target`s would let a
    reader and a verifier disagree about what was signed).

    Raises:
        MalformedCommandError: too large, not UTF-8 JSON, not an object, or a duplicate key.
    """
    if len(raw) > MAX_COMMAND_BYTES:
        raise MalformedCommandError(f"the body is {len(raw)} bytes; a command is at most {MAX_COMMAND_BYTES}")
    try:
        document = load_json(raw, object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedCommandError(f"the body is not UTF-8 JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise MalformedCommandError(f"a command is a JSON object, got {type(document).__name__}")
    return document


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise MalformedCommandError(f"field {key} appears twice")
        document[key] = value
    return document


def _string(document: Mapping[str, Any], name: str) -> str:
    value = document.get(name)
    if not isinstance(value, str) or not value:
        raise MalformedCommandError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _optional_string(document: Mapping[str, Any], name: str) -> str | None:
    if document.get(name) is None:
        return None
    return _string(document, name)


def _command_type(document: Mapping[str, Any]) -> CommandType:
    value = document.get("type")
    try:
        return CommandType(value)
    except ValueError:
        allowed = ", ".join(member.value for member in CommandType)
        raise MalformedCommandError(f"type must be one of {allowed}, got {value!r}") from None


def _timestamp(document: Mapping[str, Any], name: str) -> datetime:
    text = _string(document, name)
    try:
        return parse_rfc3339(text)
    except ValueError as exc:
        raise MalformedCommandError(f"{name}: {exc}") from exc


def _optional_timestamp(document: Mapping[str, Any], name: str) -> datetime | None:
    if document.get(name) is None:
        return None
    return _timestamp(document, name)


def check_target(value: object, name: str = "target") -> str:
    """A VM name a command can be addressed to (what `Command` itself requires of its target).

    `name` is the field that holds it, for the error message.

    Raises:
        MalformedCommandError: not a non-empty string, a control character, or too long.
    """
    return _check_text(value, name, MAX_TARGET_LENGTH, "no Azure or GCE VM name is longer")


def check_event_id(value: object, name: str = "event_id") -> str:
    """An event id a command can carry (what `Command` itself requires of its event_id).

    Raises:
        MalformedCommandError: not a non-empty string, a control character, or too long.
    """
    return _check_text(value, name, MAX_EVENT_ID_LENGTH, "no Azure or GCE event id is longer")


def _check_text(value: object, name: str, longest: int, why: str) -> str:
    if not isinstance(value, str) or not value:
        raise MalformedCommandError(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > longest:
        # Not the value itself: it may be any size.
        raise MalformedCommandError(f"{name} is {len(value)} characters; at most {longest} ({why})")
    if _CONTROL_CHARACTER.search(value):
        raise MalformedCommandError(f"{name} must not contain control characters, got {value!r}")
    if not value.isascii() and _LONE_SURROGATE.search(value):
        # A lone surrogate has no UTF-8 form: the command could be built but never encoded.
        raise MalformedCommandError(f"{name} must be Unicode text, got {value!r}")
    return value


def _wire_precision(moment: object, name: str) -> datetime:
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise MalformedCommandError(f"{name} must be a timezone-aware datetime (UTC), got {moment!r}")
    utc = moment.astimezone(timezone.utc)
    return utc.replace(microsecond=utc.microsecond // 1000 * 1000)
