"""The audit codec writes what the stores always held, and reads what they hold back the same.

The stored form below is what every store wrote before the codec (SQLite rows, Table entities,
Firestore documents but for their timestamps), and then with the trace id: both must stay
readable as they are.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from functions.core.audit_codec import (
    AUDIT_FIELDS,
    also_named,
    audit_fields,
    audit_record,
    event_id_lower,
    named_vms,
    names,
)
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


def test_a_record_names_the_vms_it_is_filed_under_and_those_its_event_lists() -> None:
    # GIVEN a refused report filed under its sender about two other VMs, a wait filed under the VMs
    # it holds back, an own report, and a malformed message (no VM)
    refused = AuditRecord(NOW, "not-self", "e", "E-1", "web-2", action="none", detail={"resources": ["web-0", "web-1"]})
    wait = AuditRecord(NOW, "action", "e", "E-1", "web-0,web-1", action="wait", detail={"resources": ["web-0"]})
    own = replace(refused, kind="event", vm="web-0", detail={"resources": ["web-0"]})
    malformed = AuditRecord(NOW, "malformed", "b" * 64, "", "", action="none")

    # THEN each names every VM once, in the order named; and beside its `vm`, only the others
    assert named_vms(refused) == ("web-2", "web-0", "web-1")
    assert also_named(refused) == ("web-0", "web-1")
    assert named_vms(wait) == ("web-0", "web-1")
    assert also_named(wait) == ("web-0", "web-1")  # no VM is called "web-0,web-1"
    assert (named_vms(own), also_named(own)) == (("web-0",), ())
    assert (named_vms(malformed), also_named(malformed)) == ((), ())
    assert [names(refused, "web-0"), names(wait, "web-1"), names(own, "web-1")] == [True, True, False]
    assert names(malformed, "")  # filed under no VM: found as such


def test_a_detail_that_is_not_what_the_core_writes_names_nothing_more() -> None:
    # GIVEN records of an old or tampered log whose `resources` are not a list of names
    odd = [
        AuditRecord(NOW, "event", "e", "E-1", "web-0", detail={"resources": "web-1"}),
        AuditRecord(NOW, "event", "e", "E-1", "web-0", detail={"resources": [1, None, {"vm": "web-1"}, ""]}),
    ]
    # THEN they name the VM they are filed under only
    assert [named_vms(record) for record in odd] == [("web-0",), ("web-0",)]
