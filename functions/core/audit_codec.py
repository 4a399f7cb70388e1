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
NULL for an empty `at` (SQLite), the folded event id the document stores query on
(`EVENT_ID_LOWER`: event ids match in any case, and Azure's come in either), and the VMs a record
names besides the one it is filed under (`also_named`: SQLite's `audit_named` table, Firestore's
`ALSO_NAMED` array), so that one VM's view finds a report another VM sent about it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from functions.core.ports import AuditRecord
from wire.timefmt import format_rfc3339, parse_rfc3339

AUDIT_FIELDS = (
    "time", "kind", "envelope_id", "event_id", "vm", "action", "status", "rule", "reason", "at", "detail", "trace_id",
)  # fmt: skip
# The event id in lower case, beside the record, where a store cannot fold case in its query.
EVENT_ID_LOWER = "event_id_lower"
# The VMs a record names other than its `vm` (`also_named`), beside it, where a store cannot look
# inside `detail` in a query.
ALSO_NAMED = "also_named"


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


def named_vms(record: AuditRecord) -> tuple[str, ...]:
    """Every VM the record names, each once, in the order named: where it is filed (`vm`: a wait and
    an expired budget slot name the VMs they hold there, separated by commas) and the VMs of its
    event listed in `detail` (`resources`: a report about several VMs, a refused report about
    others). An event's list holds its first `AUDIT_RESOURCES` VMs only; the others are counted
    (`resources_not_listed`), so a record does not name them."""
    return vms_named(record.vm, record.detail)


def vms_named(vm: str, detail: object) -> tuple[str, ...]:
    """`named_vms` of a record filed under `vm` with this `detail`, however its detail was read."""
    filed = vm.split(",") if vm else []
    listed = detail.get("resources") if isinstance(detail, Mapping) else None
    named = [*filed, *(listed if isinstance(listed, Sequence) and not isinstance(listed, str) else ())]
    return tuple(dict.fromkeys(name.strip() for name in named if isinstance(name, str) and name.strip()))


def also_named(record: AuditRecord) -> tuple[str, ...]:
    """The VMs the record names (`named_vms`) other than the one its `vm` is: what a store that
    finds records by their `vm` keeps beside a record to find it by the others."""
    return tuple(name for name in named_vms(record) if name != record.vm)


def names(record: AuditRecord, vm: str) -> bool:
    """Whether the record belongs to `vm`'s view: filed under it (a malformed message's record is
    filed under no VM, "") or naming it anywhere (`named_vms`)."""
    return record.vm == vm or vm in named_vms(record)
