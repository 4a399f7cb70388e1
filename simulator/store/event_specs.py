"""Validation of a request to add an Azure event (POST /_sim/events body or a scenario `add` step).

Each field error names the field; the small field readers are shared with the GCE and fault bodies.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import TypeVar

from simulator.store.azure_events import ApprovalRule, EventSource, EventSpec, EventStatus, EventType
from simulator.store.requests import FieldError


def parse_event_spec(body: Mapping[str, object]) -> EventSpec:
    """Validate a POST /_sim/events body (also a scenario `add` step)."""
    allowed = {
        "event_type",
        "resources",
        "event_id",
        "status",
        "notice",
        "started_for",
        "event_source",
        "duration_seconds",
        "description",
        "audience",
        "approval",
        "keep_serving",
    }
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise FieldError(unknown[0], f"unknown field; allowed: {', '.join(sorted(allowed))}")
    event_type = _enum_field(body, "event_type", EventType, required=True)
    assert event_type is not None
    status = _enum_field(body, "status", EventStatus) or EventStatus.SCHEDULED
    source = _enum_field(body, "event_source", EventSource) or EventSource.PLATFORM
    event_id = body.get("event_id")
    if event_id is not None and (not isinstance(event_id, str) or not event_id.strip()):
        raise FieldError("event_id", "must be a non-empty string (Azure uses GUIDs)")
    description = body.get("description")
    if description is not None and not isinstance(description, str):
        raise FieldError("description", "must be a string")
    duration = body.get("duration_seconds", -1)
    if isinstance(duration, bool) or not isinstance(duration, int) or duration < -1:
        raise FieldError("duration_seconds", "must be an integer >= -1 (-1 means unknown)")
    return EventSpec(
        event_type=event_type,
        resources=_names_field(body, "resources"),
        event_id=event_id,
        status=status,
        notice=_seconds_field(body, "notice"),
        started_for=_seconds_field(body, "started_for"),
        event_source=source,
        duration_seconds=duration,
        description=description,
        audience=_names_field(body, "audience"),
        approval=_enum_field(body, "approval", ApprovalRule) or ApprovalRule.ANY,
        keep_serving=bool_field(body, "keep_serving"),
    )


_E = TypeVar("_E", bound=Enum)


def _enum_field(body: Mapping[str, object], name: str, kind: type[_E], required: bool = False) -> _E | None:
    value = body.get(name)
    choices = ", ".join(str(m.value) for m in kind)
    if value is None:
        if required:
            raise FieldError(name, f"is required; one of {choices}")
        return None
    for member in kind:
        if isinstance(value, str) and value.lower() == str(member.value).lower():
            return member
    raise FieldError(name, f"must be one of {choices}, got {value!r}")


def bool_field(body: Mapping[str, object], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise FieldError(name, "must be true or false")
    return value


def _names_field(body: Mapping[str, object], name: str) -> tuple[str, ...] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise FieldError(name, "must be a list of VM names (strings; '$0' means the first VM)")
    return tuple(str(v) for v in value)


def _seconds_field(body: Mapping[str, object], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise FieldError(name, "must be a number of documented seconds >= 0")
    return float(value)
