"""GCE metadata values: maintenance-event, upcoming-maintenance and preempted.

GCE has no event ids, so one is derived (wire/gce_ids.py, docs/contracts.md#deterministic-ids):
SHA-256 of `instance_id|key|anchor`, where the anchor is the first-observed time (persisted
by the agent) or, for upcoming-maintenance, its stable windowStartTime.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Callable, TypedDict, TypeVar

from wire.errors import MalformedDocumentError
from wire.gce_ids import (
    MAINTENANCE_EVENT_KEY,
    PREEMPTED_KEY,
    UPCOMING_MAINTENANCE_KEY,
    gce_event_id,
)
from wire.jsontext import load_json
from wire.model import Cloud, EventKind, EventStatus, JsonObject, MaintenanceEvent
from wire.timefmt import format_rfc3339, parse_rfc3339


class MaintenanceValue(str, Enum):
    """The documented values of instance/maintenance-event. GCE metadata is unversioned and Google
    may add values: any other well-formed value is a maintenance too (kind `unknown`)."""

    NONE = "NONE"
    MIGRATE_ON_HOST_MAINTENANCE = "MIGRATE_ON_HOST_MAINTENANCE"
    TERMINATE_ON_HOST_MAINTENANCE = "TERMINATE_ON_HOST_MAINTENANCE"


# How long before impact GCE changes the value (reference doc): 60 s before a
# live migration, 60 min before a terminate (GPU, bare metal). An unknown value has no known notice.
NOTICE = {
    MaintenanceValue.MIGRATE_ON_HOST_MAINTENANCE.value: timedelta(seconds=60),
    MaintenanceValue.TERMINATE_ON_HOST_MAINTENANCE.value: timedelta(minutes=60),
}

KIND = {
    MaintenanceValue.MIGRATE_ON_HOST_MAINTENANCE.value: EventKind.LIVE_MIGRATE,
    MaintenanceValue.TERMINATE_ON_HOST_MAINTENANCE.value: EventKind.HOST_TERMINATE,
}

# What a metadata value looks like: an upper-case word of letters, digits and underscores. Anything
# else (binary, blanks inside, a cut-off answer) is a garbled answer, read again, never a value.
_VALUE_WORD = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")


def parse_maintenance_event(text: bytes | str) -> str:
    """Parse the value of instance/maintenance-event: NONE, one of the documented maintenance values,
    or a value Google added since (returned as sent, upper-cased; its kind is `unknown`).

    Raises:
        MalformedDocumentError: the answer is not a value at all (garbled); read it again.
    """
    value = _text(text).strip().upper()
    if not _VALUE_WORD.match(value):
        raise MalformedDocumentError(
            f"maintenance-event answered {value[:80]!r}, which is not a value (an upper-case word such as "
            f"{MaintenanceValue.MIGRATE_ON_HOST_MAINTENANCE.value}); will retry"
        )
    return value


def is_documented_maintenance_value(value: str) -> bool:
    return value in KIND or value == MaintenanceValue.NONE.value


def parse_preempted(text: bytes | str) -> bool:
    """Parse instance/preempted (TRUE or FALSE)."""
    value = _text(text).strip().upper()
    if value not in ("TRUE", "FALSE"):
        raise MalformedDocumentError(f"preempted value {value[:80]!r} is not TRUE or FALSE; will retry")
    return value == "TRUE"


class UpcomingMaintenanceWire(TypedDict, total=False):
    """instance/upcoming-maintenance as served (the doc prints canReschedule as a string)."""

    maintenanceType: str
    canReschedule: bool | str
    latestWindowStartTime: str
    maintenanceStatus: str
    windowEndTime: str
    windowStartTime: str


@dataclass(frozen=True)
class UpcomingMaintenance:
    maintenance_type: str
    status: str
    can_reschedule: bool | None
    window_start: datetime | None
    window_end: datetime | None
    latest_window_start: datetime | None
    raw: JsonObject = field(hash=False)
    # Each field that could not be read (its value above is then empty), and why.
    unreadable: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def anchor(self) -> str | None:
        """What makes this notice's id stable across polls and restarts (docs/contracts.md#deterministic-ids):
        its windowStartTime. None when GCE sent no window; then the caller anchors
        the id on the first-observed time, as for the other keys."""
        return format_rfc3339(self.window_start) if self.window_start is not None else None

    @property
    def summary(self) -> str:
        """One line for people reading the audit log."""
        start = format_rfc3339(self.window_start) if self.window_start else "?"
        end = format_rfc3339(self.window_end) if self.window_end else "?"
        reschedule = {
            True: "can be rescheduled",
            False: "cannot be rescheduled",
            None: "rescheduling unknown",
        }
        return (
            f"{self.maintenance_type or 'UNKNOWN'} maintenance {self.status or 'PENDING'}, window {start} to {end}, "
            f"{reschedule[self.can_reschedule]}"
        )

    @property
    def ongoing(self) -> bool:
        return self.status == "ONGOING"


def parse_upcoming_maintenance(text: bytes | str) -> UpcomingMaintenance:
    """Parse instance/upcoming-maintenance (valid JSON; booleans may come as strings). A field that
    cannot be read is left empty and named in `unreadable`: the notice is reported all the same.

    Raises:
        MalformedDocumentError: not a JSON object (garbled); read it again.
    """
    try:
        document = load_json(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedDocumentError(f"upcoming-maintenance is not JSON ({exc}); will retry") from exc
    if not isinstance(document, dict):
        raise MalformedDocumentError("upcoming-maintenance must be a JSON object")
    unreadable: dict[str, str] = {}
    return UpcomingMaintenance(
        maintenance_type=_lenient(_string, document, "maintenanceType", unreadable, ""),
        status=_lenient(_string, document, "maintenanceStatus", unreadable, "").upper(),
        can_reschedule=_lenient(_boolean, document, "canReschedule", unreadable, None),
        window_start=_lenient(_time, document, "windowStartTime", unreadable, None),
        window_end=_lenient(_time, document, "windowEndTime", unreadable, None),
        latest_window_start=_lenient(_time, document, "latestWindowStartTime", unreadable, None),
        raw=dict(document),
        unreadable=unreadable,
    )


_FieldT = TypeVar("_FieldT")


def _lenient(
    read: Callable[[JsonObject, str], _FieldT],
    document: JsonObject,
    name: str,
    unreadable: dict[str, str],
    empty: _FieldT,
) -> _FieldT:
    """One field by `read`, or `empty` with the reason noted when it cannot be read."""
    try:
        return read(document, name)
    except MalformedDocumentError as exc:
        unreadable[name] = str(exc)
        return empty


def _text(value: bytes | str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedDocumentError(f"metadata value is not UTF-8 text ({exc}); will retry") from exc
    return value


def _string(document: JsonObject, name: str) -> str:
    value = document.get(name, "")
    if not isinstance(value, str):
        raise MalformedDocumentError(f"upcoming-maintenance.{name} must be a string, got {repr(value)[:80]}")
    return value


def _boolean(document: JsonObject, name: str) -> bool | None:
    """true/false as JSON booleans or as the strings "true"/"false" (as the doc shows)."""
    value = document.get(name)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise MalformedDocumentError(f"upcoming-maintenance.{name} must be true or false, got {repr(value)[:80]}")


def _time(document: JsonObject, name: str) -> datetime | None:
    value = document.get(name)
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise MalformedDocumentError(f"upcoming-maintenance.{name} must be an RFC 3339 string")
    try:
        return parse_rfc3339(value)
    except ValueError as exc:
        raise MalformedDocumentError(f"upcoming-maintenance.{name}: {exc}") from exc


def maintenance_event(
    *,
    value: str,
    status: EventStatus,
    instance_id: str,
    reporter: str,
    first_observed: datetime,
    sequence: str,
) -> MaintenanceEvent:
    """The event for a MIGRATE/TERMINATE value first seen at `first_observed`.

    The completion (value back to NONE) is built with the same `value` and
    `first_observed`, so it carries the same event_id as its scheduled step. A value that is not
    documented is a maintenance of kind `unknown`, with no known notice (not_before null).
    """
    if isinstance(value, MaintenanceValue):
        value = value.value  # the text, not the member's name, goes into the description and raw
    if value == MaintenanceValue.NONE.value:
        raise ValueError("NONE is the absence of an event; pass the value that was announced")
    notice = NOTICE.get(value)
    return MaintenanceEvent(
        cloud=Cloud.GCE,
        event_id=gce_event_id(instance_id, MAINTENANCE_EVENT_KEY, first_observed),
        kind=KIND.get(value, EventKind.UNKNOWN),
        status=status,
        reporter=reporter,
        sequence=sequence,
        resources=(reporter,),
        not_before=first_observed + notice if notice is not None else None,
        description=f"{MAINTENANCE_EVENT_KEY} is {value}",
        raw={"key": MAINTENANCE_EVENT_KEY, "value": value},
        unreadable=() if value in KIND else ("value",),
    )


def upcoming_event(
    *,
    upcoming: UpcomingMaintenance,
    status: EventStatus,
    instance_id: str,
    reporter: str,
    first_observed: datetime,
    sequence: str,
) -> MaintenanceEvent:
    """The advance notice of upcoming-maintenance (kind `upcoming`)."""
    anchor = upcoming.anchor or format_rfc3339(first_observed)
    return MaintenanceEvent(
        cloud=Cloud.GCE,
        event_id=gce_event_id(instance_id, UPCOMING_MAINTENANCE_KEY, anchor),
        kind=EventKind.UPCOMING,
        status=status,
        reporter=reporter,
        sequence=sequence,
        resources=(reporter,),
        not_before=upcoming.window_start,
        description=upcoming.summary,
        raw={"key": UPCOMING_MAINTENANCE_KEY, "value": upcoming.raw},
        unreadable=tuple(upcoming.unreadable),
    )


def preempted_event(*, instance_id: str, reporter: str, first_observed: datetime, sequence: str) -> MaintenanceEvent:
    """preempted turned TRUE: the VM is stopping now (no completion follows)."""
    return MaintenanceEvent(
        cloud=Cloud.GCE,
        event_id=gce_event_id(instance_id, PREEMPTED_KEY, first_observed),
        kind=EventKind.PREEMPT,
        status=EventStatus.STARTED,
        reporter=reporter,
        sequence=sequence,
        resources=(reporter,),
        not_before=None,
        description="preempted is TRUE: the VM is being stopped",
        raw={"key": PREEMPTED_KEY, "value": "TRUE"},
    )
