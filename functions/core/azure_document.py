"""Azure Scheduled Events documents: the wire shape, a strict parser, and the mapping
of one Azure event onto `MaintenanceEvent` (design §3.2).

The parser validates at the edge so that nothing downstream has to guess: a field
with the wrong type is an error that names the field, never a silent default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, TypedDict

from functions.core.errors import MalformedDocumentError
from functions.core.jsontext import load_json
from functions.core.model import (
    Cloud,
    EventKind,
    EventSource,
    EventStatus,
    JsonObject,
    MaintenanceEvent,
)
from functions.core.timefmt import parse_rfc1123

# A quoted integer: ASCII digits only (str.isdigit() also takes "²"), and no longer than an int64.
_DECIMAL = re.compile(r"^-?[0-9]{1,18}$")


class AzureEventWire(TypedDict, total=False):
    """One entry of `Events` as IMDS prints it (fields depend on the api-version)."""

    EventId: str
    EventType: str
    ResourceType: str
    Resources: list[str]
    EventStatus: str
    NotBefore: str
    Description: str
    EventSource: str
    DurationInSeconds: int


class ScheduledEventsWire(TypedDict):
    DocumentIncarnation: int
    Events: list[AzureEventWire]


class AzureEventStatus(str, Enum):
    SCHEDULED = "Scheduled"
    STARTED = "Started"


EVENT_KINDS = {
    "Freeze": EventKind.FREEZE,
    "Reboot": EventKind.REBOOT,
    "Redeploy": EventKind.REDEPLOY,
    "Preempt": EventKind.PREEMPT,
    "Terminate": EventKind.TERMINATE,
}


@dataclass(frozen=True)
class AzureScheduledEvent:
    """One validated Azure event. `raw` is the entry exactly as received."""

    event_id: str
    kind: EventKind
    status: AzureEventStatus
    resources: tuple[str, ...]
    not_before: datetime | None
    description: str
    event_source: EventSource | None
    duration_seconds: int | None
    raw: JsonObject = field(hash=False)


@dataclass(frozen=True)
class ScheduledEventsDocument:
    incarnation: int
    events: tuple[AzureScheduledEvent, ...]

    def by_id(self) -> Mapping[str, AzureScheduledEvent]:
        """Events keyed by lowercased EventId (GUIDs compare case-insensitively)."""
        return {event.event_id.lower(): event for event in self.events}


def parse_scheduled_events(body: bytes | str) -> ScheduledEventsDocument:
    """Parse the body of GET /metadata/scheduledevents.

    Raises:
        MalformedDocumentError: not JSON, or a field is missing or mistyped; the
            message names it. The caller should keep its previous state and poll again.
    """
    try:
        document = load_json(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedDocumentError(f"scheduled events document is not JSON ({exc}); will retry") from exc
    if not isinstance(document, dict):
        raise MalformedDocumentError("scheduled events document must be a JSON object with DocumentIncarnation")
    incarnation = _integer(document.get("DocumentIncarnation"), "DocumentIncarnation")
    if incarnation is None:
        raise MalformedDocumentError("DocumentIncarnation is missing from the scheduled events document")
    entries = document.get("Events")
    if not isinstance(entries, list):
        raise MalformedDocumentError("Events must be a list (empty when nothing is scheduled)")
    events = tuple(parse_event(entry, f"Events[{index}]") for index, entry in enumerate(entries))
    seen = set()
    for event in events:
        if event.event_id.lower() in seen:
            raise MalformedDocumentError(f"EventId {event.event_id} appears twice in one document")
        seen.add(event.event_id.lower())
    return ScheduledEventsDocument(incarnation=incarnation, events=events)


def parse_event(entry: Any, where: str = "event") -> AzureScheduledEvent:
    """Validate one entry of `Events` (also used to restore an event from saved state).

    Raises:
        MalformedDocumentError: naming `where` and the field.
    """
    if not isinstance(entry, dict):
        raise MalformedDocumentError(f"{where} must be an object")
    event_id = entry.get("EventId")
    if not isinstance(event_id, str) or not event_id.strip():
        raise MalformedDocumentError(f"{where}.EventId is missing or not a string")
    event_type = entry.get("EventType")
    kind = EVENT_KINDS.get(event_type) if isinstance(event_type, str) else None
    if kind is None:
        raise MalformedDocumentError(
            f"{where}.EventType {event_type!r} is not one of {', '.join(EVENT_KINDS)}; "
            "upgrade maintenance-bridge if Azure added a new type"
        )
    status_text = entry.get("EventStatus")
    try:
        status = AzureEventStatus(status_text)
    except ValueError:
        raise MalformedDocumentError(f"{where}.EventStatus {status_text!r} is not Scheduled or Started") from None
    resources = entry.get("Resources", [])
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise MalformedDocumentError(f"{where}.Resources must be a list of resource names")
    not_before_text = entry.get("NotBefore", "")
    if not isinstance(not_before_text, str):
        raise MalformedDocumentError(f"{where}.NotBefore must be a string (RFC 1123 or empty)")
    try:
        not_before = parse_rfc1123(not_before_text) if not_before_text.strip() else None
    except ValueError as exc:
        raise MalformedDocumentError(f"{where}.NotBefore: {exc}") from exc
    description = entry.get("Description", "")
    if not isinstance(description, str):
        raise MalformedDocumentError(f"{where}.Description must be a string")
    source_text = entry.get("EventSource")
    event_source: EventSource | None = None
    if source_text not in (None, ""):
        if not isinstance(source_text, str) or source_text.lower() not in ("platform", "user"):
            raise MalformedDocumentError(f"{where}.EventSource {source_text!r} is not Platform or User")
        event_source = EventSource(source_text.lower())
    return AzureScheduledEvent(
        event_id=event_id,
        kind=kind,
        status=status,
        resources=tuple(resources),
        not_before=not_before,
        description=description,
        event_source=event_source,
        duration_seconds=_integer(entry.get("DurationInSeconds"), f"{where}.DurationInSeconds"),
        raw=dict(entry),
    )


def _integer(value: Any, name: str) -> int | None:
    """An integer field. Digit strings pass too: the docs only show placeholders for
    these fields, and refusing a quoted number would lose a real event."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise MalformedDocumentError(f"{name} must be an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _DECIMAL.match(value.strip()):
        return int(value.strip())
    raise MalformedDocumentError(f"{name} must be an integer, got {value!r}")


def to_maintenance_event(
    event: AzureScheduledEvent,
    *,
    status: EventStatus,
    reporter: str,
    sequence: str,
) -> MaintenanceEvent:
    """Map one Azure event onto the shared model at the lifecycle `status` the
    caller derived (the diff decides scheduled/started/completed/canceled)."""
    return MaintenanceEvent(
        cloud=Cloud.AZURE,
        event_id=event.event_id,
        kind=event.kind,
        status=status,
        reporter=reporter,
        sequence=sequence,
        resources=event.resources,
        not_before=event.not_before,
        duration_seconds=event.duration_seconds,
        event_source=event.event_source,
        description=event.description,
        raw=event.raw,
    )
