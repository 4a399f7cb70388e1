"""Validation of a GCE change: a POST /_sim/gce body, also a scenario `gce` step.

Each error names the field it is about; upcoming-maintenance takes verbatim RFC 3339 window times
or times relative to the moment the change is applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from simulator.gce_api.values import GceChange, GceKey, MaintenanceEvent, UpcomingPatch
from simulator.store import FieldError, bool_field

_UPCOMING_FIELDS = {
    "maintenanceType",
    "canReschedule",
    "maintenanceStatus",
    "windowStartTime",
    "windowEndTime",
    "latestWindowStartTime",
    "window_start_in",
    "window_length",
}


def parse_gce_change(body: Mapping[str, object]) -> GceChange:
    allowed = {"vm", "key", "value", "require_watch", "keep_serving"}
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise FieldError(unknown[0], f"unknown field; allowed: {', '.join(sorted(allowed))}")
    vm = body.get("vm")
    if vm is not None and (not isinstance(vm, str) or not vm):
        raise FieldError("vm", "must be a VM name ('$0' means the first VM)")
    require_watch = bool_field(body, "require_watch", default=True)
    raw_key = body.get("key")
    keys = ", ".join(k.value for k in GceKey)
    if raw_key not in {k.value for k in GceKey}:
        raise FieldError("key", f"must be one of {keys}, got {raw_key!r}")
    key = GceKey(raw_key)
    if "value" not in body:
        raise FieldError("value", "is required (null removes upcoming-maintenance)")
    value = body["value"]
    change = GceChange(key=key, vm=vm, require_watch=require_watch, keep_serving=bool_field(body, "keep_serving"))
    if key is GceKey.MAINTENANCE_EVENT:
        names = ", ".join(m.value for m in MaintenanceEvent)
        if value not in {m.value for m in MaintenanceEvent}:
            raise FieldError("value", f"maintenance-event must be one of {names}, got {value!r}")
        return replace(change, maintenance_event=MaintenanceEvent(value))
    if key is GceKey.PREEMPTED:
        preempted = _bool_value(value)
        if preempted is None:
            raise FieldError("value", f"preempted must be TRUE or FALSE, got {value!r}")
        return replace(change, preempted=preempted)
    if value is None:
        return change
    if not isinstance(value, dict):
        raise FieldError("value", "upcoming-maintenance must be an object, or null to remove it")
    return replace(change, upcoming=_parse_upcoming(value))


def _parse_upcoming(value: Mapping[str, object]) -> UpcomingPatch:
    unknown = sorted(set(value) - _UPCOMING_FIELDS)
    if unknown:
        raise FieldError(f"value.{unknown[0]}", f"unknown field; allowed: {', '.join(sorted(_UPCOMING_FIELDS))}")
    strings: dict[str, str | None] = {}
    for name in ("maintenanceType", "maintenanceStatus", "windowStartTime", "windowEndTime", "latestWindowStartTime"):
        raw = value.get(name)
        if raw is not None and (not isinstance(raw, str) or not raw):
            raise FieldError(f"value.{name}", "must be a non-empty string")
        strings[name] = raw
    status = strings["maintenanceStatus"]
    if status is not None and status not in {"PENDING", "ONGOING"}:
        raise FieldError("value.maintenanceStatus", "must be PENDING or ONGOING")
    can_reschedule = None
    if "canReschedule" in value:
        can_reschedule = _bool_value(value["canReschedule"])
        if can_reschedule is None:
            raise FieldError("value.canReschedule", 'must be true/false or the strings "true"/"false"')
    seconds: dict[str, float | None] = {}
    for name in ("window_start_in", "window_length"):
        raw_seconds = value.get(name)
        if raw_seconds is not None and (
            isinstance(raw_seconds, bool) or not isinstance(raw_seconds, (int, float)) or raw_seconds < 0
        ):
            raise FieldError(f"value.{name}", "must be documented seconds >= 0")
        seconds[name] = None if raw_seconds is None else float(raw_seconds)
    return UpcomingPatch(
        maintenance_type=strings["maintenanceType"],
        can_reschedule=can_reschedule,
        maintenance_status=status,
        window_start_in=seconds["window_start_in"],
        window_length=seconds["window_length"],
        window_start_time=strings["windowStartTime"],
        window_end_time=strings["windowEndTime"],
        latest_window_start_time=strings["latestWindowStartTime"],
    )


def _bool_value(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in {"true", "false"}:
        return value.lower() == "true"
    return None
