"""The structured fields of log lines, the same in the agent and the functions.

Each log call about an event passes what it is about through `extra`, so that every process can
put it into top-level keys of its JSON lines and one query finds an event on the VM and in the
functions (`jq 'select(.event_id == "…")'`, Cloud Logging `jsonPayload.event_id`, KQL
`parse_json`); docs/operations.md#logs lists them.

    LOGGER.info("drain %s", vm, extra=event_fields(event, envelope_id=envelope.id))
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import date, datetime
from enum import Enum
from typing import Any

from wire.model import MaintenanceEvent

FIELDS = (
    "event_id",
    "cloud",
    "kind",
    "status",
    "vm",
    "command_id",
    "command_type",
    "envelope_id",
    "result",
    "action",
    "rule",
    "alert",  # set on a line an operator must be told about (e.g. proof-reused: a forgery that passed a check)
    "trace_id",  # the W3C trace of the maintenance (wire/tracecontext.py): one per event, VM to functions and back
)
# A field value is cut to this many characters, like audit records and every other log text.
MAX_VALUE_CHARS = 2048
_MAX_DEPTH = 4


def fields(**values: object) -> dict[str, object]:
    """The `extra` of a log call: the given fields without the empty ones (an unknown VM or event
    is left out rather than logged as "")."""
    return {key: value for key, value in values.items() if value is not None and value != ""}


def event_fields(event: MaintenanceEvent, **more: object) -> dict[str, object]:
    """The fields of one VM's part of a maintenance event (`vm` is the VM that reported it)."""
    return fields(
        event_id=event.event_id,
        cloud=event.cloud.value,
        kind=event.kind.value,
        status=event.status.value,
        vm=event.reporter,
        **more,
    )


def json_safe(value: object, depth: int = 0) -> Any:
    """`value` as something json.dumps writes as strict JSON: no NaN or Infinity (which strict
    parsers refuse), string keys, enums as their value, times in ISO 8601, anything else as text;
    bounded in depth and length so one odd value cannot make a line unreadable or huge."""
    if isinstance(value, Enum):
        return json_safe(value.value, depth)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return value[:MAX_VALUE_CHARS]
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if depth >= _MAX_DEPTH:
        return str(value)[:MAX_VALUE_CHARS]
    if isinstance(value, Mapping):
        return {str(key)[:MAX_VALUE_CHARS]: json_safe(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(item, depth + 1) for item in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")[:MAX_VALUE_CHARS]
    return str(value)[:MAX_VALUE_CHARS]
