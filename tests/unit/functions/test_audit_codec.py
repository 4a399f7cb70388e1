"""The audit codec writes what the stores always held, and reads what they hold back the same.

The stored form below is what every store wrote before the codec (SQLite rows, Table entities,
Firestore documents but for their timestamps), and then with the trace id: both must stay
readable as they are.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from functions.core.audit_codec import AUDIT_FIELDS, audit_fields, audit_record, event_id_lower
from functions.core.ports import ActionName, AuditKind, AuditRecord

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"

APPROVAL = AuditRecord(
    time=NOW + timedelta(microseconds=123_456),
    kind=AuditKind.ACTION,
    envelope_id="a" * 64,
    event_id="C7061BAC-AFDC",
    vm="web-0",
    action=ActionName.APPROVE,
    status="scheduled",
    rule="azure-scheduled",
    reason="drained; approve after the drain period",
    at=NOW + timedelta(seconds=30),
    detail={"resources": ["web-0"], "cloud": "azure", "n": 1.5},
    trace_id=TRACE_ID,
)
STORED_BEFORE_TRACES: dict[str, str | None] = {
    "time": "2026-03-01T12:00:00.123Z",
    "kind": "action",
    "envelope_id": "a" * 64,
    "event_id": "C7061BAC-AFDC",
    "vm": "web-0",
    "action": "approve",
    "status": "scheduled",
    "rule": "azure-scheduled",
    "reason": "drained; approve after the drain period",
    "at": "2026-03-01T12:00:30Z",
    "detail": '{"cloud": "azure", "n": 1.5, "resources": ["web-0"]}',
}
STORED = {**STORED_BEFORE_TRACES, "trace_id": TRACE_ID}


def test_a_record_is_stored_as_plain_text_under_the_names_stores_always_used() -> None:
    fields = audit_fields(APPROVAL)
    assert fields == STORED
    assert tuple(fields) == AUDIT_FIELDS
    assert all(type(value) is str for value in fields.values())  # no enum leaks into a store


def test_a_stored_record_reads_back_at_millisecond_precision() -> None:
    assert audit_record(STORED) == replace(APPROVAL, time=NOW + timedelta(microseconds=123_000))


def test_a_record_stored_before_trace_ids_reads_back_with_none() -> None:
    # GIVEN records as a store kept them before trace ids: no field at all (Table entities, Firestore
    # documents), or the empty default an added column gives old rows (SQLite)
    older = [STORED_BEFORE_TRACES, {**STORED_BEFORE_TRACES, "trace_id": ""}, {**STORED_BEFORE_TRACES, "trace_id": None}]
    # THEN each reads back as the record it was, without a trace
    expected = replace(APPROVAL, time=NOW + timedelta(microseconds=123_000), trace_id="")
    assert [audit_record(fields) for fields in older] == [expected] * 3


def test_no_time_is_stored_empty_and_read_from_any_empty_value() -> None:
    # GIVEN a record without `at`: Table entities hold "", SQLite rows NULL, Firestore documents null
    plain = AuditRecord(NOW, "malformed", "b" * 64, "", "", action="none", reason="not JSON")
    fields = audit_fields(plain)
    assert fields["at"] == ""
    assert [audit_record({**fields, "at": empty}) for empty in ("", None)] == [plain, plain]


def test_event_ids_are_folded_for_the_stores_that_cannot_fold_them_in_a_query() -> None:
    assert event_id_lower("C7061BAC-AFDC") == event_id_lower("c7061bac-afdc") == "c7061bac-afdc"
