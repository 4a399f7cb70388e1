"""Azure Scheduled Events documents: the wire shape, a per-entry parser, and the mapping
of one Azure event onto `MaintenanceEvent` (docs/agent.md, "Reading the metadata").

Lenient where it is safe, strict where it matters: a missed maintenance is worse than an
imprecise one, so an entry with a field this release cannot read is still forwarded, with that
field empty and named in `unreadable`, and never takes the rest of the document down with it.
What the agent acts on by itself — approving — checks the fields it needs strictly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, TypedDict, TypeVar

from wire.errors import MalformedDocumentError
from wire.jsontext import load_json
from wire.model import (
    Cloud,
    EventKind,
    EventSource,
    EventStatus,
    JsonObject,
    MaintenanceEvent,
)
from wire.timefmt import parse_not_before

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
    # Neither of the documented two: the event is taken as not started yet (so its end is still
    # detected), and it is never approved (an approval needs a fresh read showing Scheduled).
    UNKNOWN = "Unknown"


_STATUSES = {"scheduled": AzureEventStatus.SCHEDULED, "started": AzureEventStatus.STARTED}


# EventType values, lowercased (matched in any casing).
EVENT_KINDS = {
    "freeze": EventKind.FREEZE,
    "reboot": EventKind.REBOOT,
    "redeploy": EventKind.REDEPLOY,
    "preempt": EventKind.PREEMPT,
    "terminate": EventKind.TERMINATE,
}


@dataclass(frozen=True)
class AzureScheduledEvent:
    """One Azure event as far as it could be read. `raw` is the entry exactly as received;
    `unreadable` maps each field that could not be read to the reason (its value here is empty)."""

    event_id: str
    kind: EventKind
    status: AzureEventStatus
    resources: tuple[str, ...]
    not_before: datetime | None
    description: str
    event_source: EventSource | None
    duration_seconds: int | None
    raw: JsonObject = field(hash=False)
    unreadable: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class ScheduledEventsDocument:
    incarnation: int
    events: tuple[AzureScheduledEvent, ...]
    # Why entries were left out (no EventId, or an EventId repeated in the document).
    skipped: tuple[str, ...] = ()

    def by_id(self) -> Mapping[str, AzureScheduledEvent]:
        """Events keyed by lowercased EventId (GUIDs compare case-insensitively)."""
        return {event.event_id.lower(): event for event in self.events}


def parse_scheduled_events(body: bytes | str) -> ScheduledEventsDocument:
    """Parse the body of GET /metadata/scheduledevents, one entry at a time.

    Only a body without its frame — not JSON, no integer DocumentIncarnation, no Events list — is
    refused: then nothing in it can be trusted and the caller reads it again. Any entry is read
    on its own: one Azure added after this release, or one that is garbled, never hides the
    others (another VM's event broadcast to the availability set must not silence this VM's own).
    An entry is kept with what can be read (`unreadable` says what could not), and only an entry
    without an EventId is left out (`skipped` says why): it cannot be followed from one document
    to the next, nor approved.

    Raises:
        MalformedDocumentError: the frame is missing; the caller should keep its previous state
            and poll again.
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
    events: dict[str, AzureScheduledEvent] = {}
    skipped: list[str] = []
    for entry in entries:
        # Reasons name no position: the agent logs each one once, and positions shift.
        try:
            event = parse_event(entry, "an entry of Events")
        except MalformedDocumentError as exc:
            skipped.append(str(exc))
            continue
        key = event.event_id.lower()
        if key in events:
            skipped.append(f"EventId {event.event_id[:80]!r} appears twice; the first entry is kept")
            continue
        events[key] = event
    return ScheduledEventsDocument(incarnation=incarnation, events=tuple(events.values()), skipped=tuple(skipped))


def parse_event(entry: Any, where: str = "event") -> AzureScheduledEvent:
    """Read one entry of `Events` (also used to restore an event from saved state) leniently:
    a field that cannot be read is left empty and named in `unreadable`, with the reason.

    Raises:
        MalformedDocumentError: the entry is not an object or has no EventId (naming `where`).
    """
    if not isinstance(entry, dict):
        raise MalformedDocumentError(f"{where} is not an object; left out")
    event_id = entry.get("EventId")
    if not isinstance(event_id, str) or not event_id.strip():
        raise MalformedDocumentError(f"{where} has no EventId (got {str(event_id)[:80]!r}); left out")
    unreadable: dict[str, str] = {}
    return AzureScheduledEvent(
        event_id=event_id,
        kind=_kind(entry, unreadable),
        status=_status(entry, unreadable),
        resources=_resources(entry, unreadable),
        not_before=_not_before(entry, unreadable),
        description=_description(entry, unreadable),
        event_source=_event_source(entry, unreadable),
        duration_seconds=_duration(entry, unreadable),
        raw=dict(entry),
        unreadable=unreadable,
    )


# Each reader below returns the field's value, or its empty value after noting in `unreadable`
# why it could not be read. Enums are matched in any casing and with surrounding blanks.


def _word(value: Any) -> str | None:
    return value.strip().lower() if isinstance(value, str) else None


_EnumT = TypeVar("_EnumT", bound=Enum)


def _member(
    entry: JsonObject, name: str, members: Mapping[str, _EnumT], unknown: _EnumT, unreadable: dict[str, str]
) -> _EnumT:
    value = entry.get(name)
    member = members.get(_word(value) or "")
    if member is None:
        unreadable[name] = f"{_shown(value)} is not one of {', '.join(word.title() for word in members)}"
        return unknown
    return member


def _kind(entry: JsonObject, unreadable: dict[str, str]) -> EventKind:
    return _member(entry, "EventType", EVENT_KINDS, EventKind.UNKNOWN, unreadable)


def _status(entry: JsonObject, unreadable: dict[str, str]) -> AzureEventStatus:
    return _member(entry, "EventStatus", _STATUSES, AzureEventStatus.UNKNOWN, unreadable)


def _resources(entry: JsonObject, unreadable: dict[str, str]) -> tuple[str, ...]:
    value = entry.get("Resources", [])
    if not isinstance(value, list):
        unreadable["Resources"] = f"{_shown(value)} is not a list of resource names"
        return ()
    names = tuple(name for name in value if isinstance(name, str))
    if len(names) != len(value):
        unreadable["Resources"] = f"{len(value) - len(names)} of its items are not names; the names were kept"
    return names


def _not_before(entry: JsonObject, unreadable: dict[str, str]) -> datetime | None:
    value = entry.get("NotBefore", "")
    if value is None or (isinstance(value, str) and not value.strip()):
        return None  # "Will be blank if the event has already started"
    if not isinstance(value, str):
        unreadable["NotBefore"] = f"{_shown(value)} is not a date"
        return None
    try:
        return parse_not_before(value)
    except ValueError as exc:
        unreadable["NotBefore"] = str(exc)
        return None


def _description(entry: JsonObject, unreadable: dict[str, str]) -> str:
    value = entry.get("Description", "")
    if not isinstance(value, str):
        unreadable["Description"] = f"{_shown(value)} is not text"
        return ""
    return value


def _event_source(entry: JsonObject, unreadable: dict[str, str]) -> EventSource | None:
    value = entry.get("EventSource")
    if value is None or _word(value) == "":
        return None  # before api-version 2019-08-01
    word = _word(value)
    if word in ("platform", "user"):
        return EventSource(word)
    unreadable["EventSource"] = f"{_shown(value)} is not Platform or User"
    return None


def _duration(entry: JsonObject, unreadable: dict[str, str]) -> int | None:
    try:
        return _integer(entry.get("DurationInSeconds"), "DurationInSeconds")
    except MalformedDocumentError as exc:
        unreadable["DurationInSeconds"] = str(exc)
        return None


def _shown(value: Any) -> str:
    """A value for a reason text, bounded: a hostile entry must not make the logs huge."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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
    raise MalformedDocumentError(f"{name} must be an integer, got {_shown(value)}")


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
        unreadable=tuple(event.unreadable),
    )
