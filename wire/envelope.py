"""CloudEvents 1.0 structured-JSON envelopes (docs/contracts.md#envelope), both directions.

The envelope `id` is deterministic — SHA-256 of `cloud|event_id|status` — so every
VM of an availability set, and an agent that restarts mid-publish, emit the same
id for the same fact. It is the dedupe key end to end, so `decode` recomputes it
and refuses an envelope whose id does not match its data.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, TypeVar, Union

from wire.errors import MalformedEnvelopeError
from wire.identity import content_digest
from wire.jsontext import load_json, require_unicode
from wire.model import (
    SCHEMA_VERSION,
    Cloud,
    CommandResult,
    EventKind,
    EventSource,
    EventStatus,
    JsonObject,
    MaintenanceEvent,
)
from wire.timefmt import format_rfc3339, parse_rfc3339

_EnumT = TypeVar("_EnumT", bound=Enum)

SPECVERSION = "1.0"
CONTENT_TYPE = "application/json"
MAINTENANCE_TYPE_PREFIX = "org.maintenancebridge.maintenance."
COMMAND_TYPE_PREFIX = "org.maintenancebridge.command."

_CONTEXT_ATTRIBUTES = frozenset({"specversion", "id", "source", "type", "subject", "time", "datacontenttype"})
# CloudEvents 1.0: extension names are lowercase a-z/0-9, at most 20 characters.
_EXTENSION_NAME = re.compile(r"^[a-z0-9]{1,20}$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# data.unreadable names fields of the cloud's entry: a handful, with short names.
MAX_UNREADABLE_FIELDS = 32
MAX_FIELD_NAME = 64

EnvelopeData = Union[MaintenanceEvent, CommandResult]
ExtensionValue = Union[str, int, bool]


def event_envelope_id(cloud: Cloud, event_id: str, status: EventStatus) -> str:
    """Lowercase hex SHA-256 of `cloud|event_id|status`.

    Azure EventIds are GUIDs that IMDS may print in either case; they are lowercased
    for the hash so that every reporter agrees on the id.
    """
    key_id = event_id.lower() if cloud is Cloud.AZURE else event_id
    return _sha256(f"{cloud.value}|{key_id}|{status.value}")


def command_result_envelope_id(command_id: str, accepted: bool) -> str:
    """Lowercase hex SHA-256 of `command_id|result` (result = accepted | rejected)."""
    return _sha256(f"{command_id}|{'accepted' if accepted else 'rejected'}")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Envelope:
    """A decoded CloudEvent: context attributes plus typed data.

    `extensions` keeps any extension attribute as received (the proof of the sender's identity
    among them), so forwarding an envelope never drops them.
    """

    id: str
    source: str
    type: str
    subject: str
    time: datetime
    data: EnvelopeData
    extensions: Mapping[str, ExtensionValue] = field(default_factory=dict, hash=False)
    # `content_digest` of the message as received; an envelope built here computes its own.
    received_digest: str = field(default="", compare=False, repr=False)

    @property
    def digest(self) -> str:
        """What the sender's proof is bound to (`wire.identity.content_digest`)."""
        return self.received_digest or content_digest(to_cloudevent(self))


def envelope_for_event(
    event: MaintenanceEvent,
    observed_at: datetime,
    extensions: Mapping[str, ExtensionValue] | None = None,
) -> Envelope:
    """Wrap an event observed at `observed_at` (when the agent saw the change)."""
    return Envelope(
        id=event_envelope_id(event.cloud, event.event_id, event.status),
        source=f"/{event.cloud.value}/{event.reporter}",
        type=MAINTENANCE_TYPE_PREFIX + event.status.value,
        subject=event.event_id,
        time=observed_at,
        data=event,
        extensions=_checked_extensions(extensions or {}),
    )


def envelope_for_command_result(
    result: CommandResult,
    cloud: Cloud,
    observed_at: datetime,
    extensions: Mapping[str, ExtensionValue] | None = None,
) -> Envelope:
    """Wrap the agent's answer to a command; it travels on the events channel."""
    return Envelope(
        id=command_result_envelope_id(result.command_id, result.accepted),
        source=f"/{cloud.value}/{result.target}",
        type=COMMAND_TYPE_PREFIX + result.result,
        subject=result.command_id,
        time=observed_at,
        data=result,
        extensions=_checked_extensions(extensions or {}),
    )


def to_cloudevent(envelope: Envelope) -> JsonObject:
    """The structured-mode JSON object of an envelope."""
    document: JsonObject = {
        "specversion": SPECVERSION,
        "id": envelope.id,
        "source": envelope.source,
        "type": envelope.type,
        "subject": envelope.subject,
        "time": format_rfc3339(envelope.time),
        "datacontenttype": CONTENT_TYPE,
    }
    document.update(envelope.extensions)
    document["data"] = (
        event_to_data(envelope.data)
        if isinstance(envelope.data, MaintenanceEvent)
        else command_result_to_data(envelope.data)
    )
    return document


def encode(envelope: Envelope) -> bytes:
    """UTF-8 JSON bytes of the structured CloudEvent (one message body)."""
    return json.dumps(to_cloudevent(envelope), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def event_to_data(event: MaintenanceEvent) -> JsonObject:
    """The `data` object of docs/contracts.md#data, snake_case, in schema order; `unreadable` only when
    some field of the cloud's entry could not be read."""
    data: JsonObject = {
        "schema_version": event.schema_version,
        "cloud": event.cloud.value,
        "event_id": event.event_id,
        "kind": event.kind.value,
        "status": event.status.value,
        "not_before": format_rfc3339(event.not_before) if event.not_before else None,
        "duration_seconds": event.duration_seconds,
        "resources": list(event.resources),
        "concerns_reporter": event.concerns_reporter,
        "event_source": event.event_source.value if event.event_source else None,
        "description": event.description,
        "reporter": event.reporter,
        "sequence": event.sequence,
        "raw": event.raw,
    }
    if event.unreadable:
        data["unreadable"] = list(event.unreadable)
    return data


def command_result_to_data(result: CommandResult) -> JsonObject:
    return {
        "command_id": result.command_id,
        "event_id": result.event_id,
        "target": result.target,
        "reason": result.reason,
    }


def decode(body: bytes | str | Mapping[str, Any]) -> Envelope:
    """Parse and validate a structured CloudEvent.

    Raises:
        MalformedEnvelopeError: anything that is not an envelope of docs/contracts.md#envelope;
            the message names the field and what was expected.
    """
    document = _load_object(body)
    specversion = document.get("specversion")
    if specversion != SPECVERSION:
        raise MalformedEnvelopeError(f"specversion must be '1.0' (CloudEvents 1.0), got {specversion!r}")
    envelope_id = _required_str(document, "id", "envelope")
    source = _required_str(document, "source", "envelope")
    event_type = _required_str(document, "type", "envelope")
    subject = _required_str(document, "subject", "envelope")
    time = _timestamp(_required_str(document, "time", "envelope"), "time")
    content_type = document.get("datacontenttype", CONTENT_TYPE)
    if not isinstance(content_type, str) or not content_type.startswith(CONTENT_TYPE):
        raise MalformedEnvelopeError(f"datacontenttype must be {CONTENT_TYPE!r}, got {content_type!r}")
    extensions = _checked_extensions(
        {k: v for k, v in document.items() if k not in _CONTEXT_ATTRIBUTES and k != "data"}
    )
    raw_data = document.get("data")
    if not isinstance(raw_data, dict):
        raise MalformedEnvelopeError("data must be a JSON object (structured mode, datacontenttype application/json)")
    if not _SHA256_HEX.match(envelope_id):
        raise MalformedEnvelopeError(f"id must be 64 lowercase hex characters (SHA-256), got {envelope_id!r}")

    data: EnvelopeData
    if event_type.startswith(MAINTENANCE_TYPE_PREFIX):
        data = event_from_data(raw_data)
        _expect(event_type == MAINTENANCE_TYPE_PREFIX + data.status.value, "type", event_type, data.status.value)
        _expect(source == f"/{data.cloud.value}/{data.reporter}", "source", source, "/<cloud>/<reporter>")
        _expect(subject == data.event_id, "subject", subject, "data.event_id")
        expected_id = event_envelope_id(data.cloud, data.event_id, data.status)
    elif event_type.startswith(COMMAND_TYPE_PREFIX):
        outcome = event_type[len(COMMAND_TYPE_PREFIX) :]
        if outcome not in ("accepted", "rejected"):
            raise MalformedEnvelopeError(f"type {event_type!r}: a command result is 'accepted' or 'rejected'")
        data = command_result_from_data(raw_data, accepted=outcome == "accepted")
        _expect(subject == data.command_id, "subject", subject, "data.command_id")
        expected_id = command_result_envelope_id(data.command_id, data.accepted)
    else:
        raise MalformedEnvelopeError(
            f"type {event_type!r} is not ours: expected {MAINTENANCE_TYPE_PREFIX}<status> "
            f"or {COMMAND_TYPE_PREFIX}accepted|rejected"
        )
    if envelope_id != expected_id:
        raise MalformedEnvelopeError(
            f"id {envelope_id} does not match its data (expected {expected_id}): "
            "the id is SHA-256 of cloud|event_id|status and is the dedupe key, so a mismatch is refused"
        )
    return Envelope(
        id=envelope_id,
        source=source,
        type=event_type,
        subject=subject,
        time=time,
        data=data,
        extensions=extensions,
        received_digest=_digest_of(document),
    )


def _digest_of(document: Mapping[str, Any]) -> str:
    try:
        return content_digest(document)
    except ValueError as exc:  # NaN or an infinity: not JSON text anyone signed
        raise MalformedEnvelopeError(f"the message is not plain JSON: {exc}") from exc


def event_from_data(data: Mapping[str, Any]) -> MaintenanceEvent:
    """Validate the `data` of a maintenance envelope and build the event.

    Unknown fields are ignored (forward compatibility within a schema version).

    Raises:
        MalformedEnvelopeError: a field is missing, has the wrong type or value.
    """
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise MalformedEnvelopeError("data.schema_version must be an integer")
    if version > SCHEMA_VERSION:
        raise MalformedEnvelopeError(
            f"data.schema_version {version} is newer than this reader ({SCHEMA_VERSION}): upgrade maintenance-bridge"
        )
    cloud = _enum(Cloud, data, "cloud")
    kind = _enum(EventKind, data, "kind")
    status = _enum(EventStatus, data, "status")
    source_value = data.get("event_source")
    event_source = None if source_value is None else _enum(EventSource, data, "event_source")
    not_before_text = data.get("not_before")
    if not_before_text is not None and not isinstance(not_before_text, str):
        raise MalformedEnvelopeError("data.not_before must be an RFC 3339 string or null")
    duration = data.get("duration_seconds")
    if duration is not None and (not isinstance(duration, int) or isinstance(duration, bool)):
        raise MalformedEnvelopeError("data.duration_seconds must be an integer or null")
    resources = data.get("resources")
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise MalformedEnvelopeError("data.resources must be a list of VM names (strings)")
    raw = data.get("raw")
    if not isinstance(raw, dict):
        raise MalformedEnvelopeError("data.raw must be a JSON object (the original payload fragment)")
    description = data.get("description")
    if not isinstance(description, str):
        raise MalformedEnvelopeError("data.description must be a string")
    unreadable = data.get("unreadable", [])
    if (
        not isinstance(unreadable, list)
        or len(unreadable) > MAX_UNREADABLE_FIELDS
        or not all(isinstance(name, str) and 0 < len(name) <= MAX_FIELD_NAME for name in unreadable)
    ):
        raise MalformedEnvelopeError(
            f"data.unreadable must be a list of at most {MAX_UNREADABLE_FIELDS} field names "
            f"(strings of 1-{MAX_FIELD_NAME} characters)"
        )
    try:
        event = MaintenanceEvent(
            cloud=cloud,
            event_id=_required_str(data, "event_id", "data"),
            kind=kind,
            status=status,
            reporter=_required_str(data, "reporter", "data"),
            sequence=_required_str(data, "sequence", "data", allow_empty=True),
            resources=tuple(resources),
            not_before=None if not_before_text is None else _timestamp(not_before_text, "data.not_before"),
            duration_seconds=duration,
            event_source=event_source,
            description=description,
            raw=raw,
            schema_version=version,
            unreadable=tuple(unreadable),
        )
    except ValueError as exc:
        raise MalformedEnvelopeError(f"data is inconsistent: {exc}") from exc
    concerns = data.get("concerns_reporter")
    if concerns is not event.concerns_reporter:
        raise MalformedEnvelopeError(
            f"data.concerns_reporter is {concerns!r} but reporter {event.reporter!r} "
            f"{'is' if event.concerns_reporter else 'is not'} in resources"
        )
    return event


def command_result_from_data(data: Mapping[str, Any], *, accepted: bool) -> CommandResult:
    reason = data.get("reason", "")
    if not isinstance(reason, str):
        raise MalformedEnvelopeError("data.reason must be a string")
    return CommandResult(
        command_id=_required_str(data, "command_id", "data"),
        accepted=accepted,
        event_id=_required_str(data, "event_id", "data"),
        target=_required_str(data, "target", "data"),
        reason=reason,
    )


def _load_object(body: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(body, Mapping):
        try:
            require_unicode(body)
        except ValueError as exc:
            raise MalformedEnvelopeError(f"the message body is not valid JSON text: {exc}") from exc
        return dict(body)
    try:
        document = load_json(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedEnvelopeError(f"the message body is not UTF-8 JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise MalformedEnvelopeError(f"a structured CloudEvent is a JSON object, got {type(document).__name__}")
    return document


def _required_str(document: Mapping[str, Any], name: str, where: str, *, allow_empty: bool = False) -> str:
    value = document.get(name)
    if not isinstance(value, str) or (not value and not allow_empty):
        prefix = "" if where == "envelope" else f"{where}."
        raise MalformedEnvelopeError(f"{prefix}{name} is required and must be a non-empty string, got {value!r}")
    return value


def _timestamp(text: str, name: str) -> datetime:
    try:
        return parse_rfc3339(text)
    except ValueError as exc:
        raise MalformedEnvelopeError(f"{name}: {exc}") from exc


def _enum(enum_type: type[_EnumT], data: Mapping[str, Any], name: str) -> _EnumT:
    value = data.get(name)
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(member.value for member in enum_type)
        raise MalformedEnvelopeError(f"data.{name} must be one of {allowed}; got {value!r}") from None


def _expect(ok: bool, name: str, actual: str, expected: str) -> None:
    if not ok:
        raise MalformedEnvelopeError(f"{name} {actual!r} does not agree with the data (expected {expected})")


def _checked_extensions(extensions: Mapping[str, Any]) -> dict[str, ExtensionValue]:
    checked: dict[str, ExtensionValue] = {}
    for name, value in extensions.items():
        if not _EXTENSION_NAME.match(name):
            raise MalformedEnvelopeError(
                f"attribute {name!r} is not a CloudEvents extension name (lowercase a-z, 0-9, at most 20)"
            )
        if not isinstance(value, (str, int, bool)):
            raise MalformedEnvelopeError(f"extension attribute {name!r} must be a string, integer or boolean")
        checked[name] = value
    return checked
