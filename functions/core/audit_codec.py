"""One audit record as the stores keep it: a flat mapping of plain text.

Every store writes the same fields under the same names, so a record reads back the same from a
SQLite row, a Table entity or a Firestore document:

    time         RFC 3339 UTC, milliseconds when there are any (the audit log's precision)
    kind, envelope_id, event_id, vm, action, status, rule, reason   the record's texts
    at           RFC 3339 like `time`, or "" when the record has none
    detail       JSON text, keys sorted
    trace_id     the maintenance's W3C trace id, or ""; a record written before it was kept has none,
                 and reads back with ""

What a store adds is its own: keys and row order (Table Storage), a timestamp type (Firestore),
NULL for an empty `at` (SQLite), and the folded event id the document stores query on
(`EVENT_ID_LOWER`: event ids match in any case, and Azure's come in either).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from functions.core.ports import AuditRecord
from wire.timefmt import format_rfc3339, parse_rfc3339

AUDIT_FIELDS = (
    "time", "kind", "envelope_id", "event_id", "vm", "action", "status", "rule", "reason", "at", "detail", "trace_id",
)  # fmt: skip
# The event id in lower case, beside the record, where a store cannot fold case in its query.
EVENT_ID_LOWER = "event_id_lower"


def audit_fields(record: AuditRecord) -> dict[str, str]:
    """The record as the stores keep it (see the module docstring)."""
    return {
        "time": format_rfc3339(record.time),
        "kind": record.kind,
        "envelope_id": record.envelope_id,
        "event_id": record.event_id,
        "vm": record.vm,
        "action": record.action,
        "status": record.status,
        "rule": record.rule,
        "reason": record.reason,
        "at": format_rfc3339(record.at) if record.at else "",
        "detail": json.dumps(record.detail, sort_keys=True),
        "trace_id": record.trace_id,
    }


def audit_record(fields: Mapping[str, Any]) -> AuditRecord:
    """The record `audit_fields` gave; an `at` that is empty or missing (None, NULL) is no time."""
    at = fields.get("at")
    return AuditRecord(
        time=parse_rfc3339(fields["time"]),
        kind=fields["kind"],
        envelope_id=fields["envelope_id"],
        event_id=fields["event_id"],
        vm=fields["vm"],
        action=fields["action"],
        status=fields["status"],
        rule=fields["rule"],
        reason=fields["reason"],
        at=parse_rfc3339(at) if at else None,
        detail=json.loads(fields["detail"]),
        trace_id=fields.get("trace_id") or "",
    )


def event_id_lower(event_id: str) -> str:
    """What `EVENT_ID_LOWER` holds for `event_id`, and what a query by event id looks for."""
    return event_id.lower()
