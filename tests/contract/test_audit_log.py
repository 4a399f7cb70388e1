"""The AuditLog contract (functions/core/ports.py) on every backend: SQLite, Table Storage (Azurite)
and Firestore (Google's emulator); tests/contract/backends.py opens them. How a record is stored
is one codec (functions/core/audit_codec.py, tests/unit/functions/test_audit_codec.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, cast

import pytest

from functions.core.ports import AuditRecord
from functions.gcp_app.firestore_store import FirestoreConfigError
from mbridge.audit_cli import AuditReader
from tests.contract.backends import BACKENDS, FIRESTORE, NOW, Backend, open_backend
from wire.bounds import MAX_AUDIT_TEXT


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    with open_backend(request) as opened:
        yield opened


def record(kind: str, vm: str, event_id: str, **fields: Any) -> AuditRecord:
    return AuditRecord(time=NOW, kind=kind, envelope_id=f"env-{event_id}", event_id=event_id, vm=vm, **fields)


def _kinds(records: Sequence[AuditRecord]) -> list[tuple[str, str, str]]:
    return [(r.vm, r.event_id, r.kind) for r in records]


def test_records_come_back_in_the_order_written_by_vm_and_by_event(backend: Backend) -> None:
    # GIVEN records of two events on two VMs, written in this order (all at the same `time`)
    written = [
        record("event", "web-0", "E-ONE"),
        record("decision", "web-0", "E-ONE", rule="5-azure-scheduled"),
        record("event", "web-1", "E-TWO"),
        record("action", "web-1", "E-ONE", action="drain"),
        record("action", "web-0", "E-ONE", action="approve", at=NOW + timedelta(seconds=30)),
        record("action", "web-1", "E-TWO", action="drain"),
    ]
    for entry in written:
        backend.audit.append(entry)

    # WHEN the log is read whole, by VM, by event, and by both
    # THEN every query keeps the written order
    assert list(backend.audit.query()) == written
    assert list(backend.audit.query(vm="web-0")) == [written[0], written[1], written[4]]
    assert list(backend.audit.query(event_id="E-ONE")) == [written[0], written[1], written[3], written[4]]
    assert list(backend.audit.query(vm="web-1", event_id="E-TWO")) == [written[2], written[5]]


def test_the_records_of_one_message_written_together_keep_their_order(backend: Backend) -> None:
    # GIVEN the records of two messages, each written in one call (`append_all`, as `process` writes
    # a message's records): the first about one VM, more than one Table transaction holds; the second
    # about two VMs in turn, as an event admitted from the waiting line adds its own
    first = [record("action", "web-0", "E-ONE", reason=str(number)) for number in range(130)]
    second = [
        record("event", "web-1", "E-TWO"),
        record("action", "web-2", "E-THREE", action="drain"),
        record("action", "web-1", "E-TWO", action="wait"),
    ]
    backend.audit.append_all(first)
    backend.audit.append_all(second)
    backend.audit.append_all([])

    # WHEN the log is read whole and by VM
    # THEN every record is there once, in the order written
    assert list(backend.audit.query()) == first + second
    assert list(backend.audit.query(vm="web-1")) == [second[0], second[2]]


def test_many_records_of_one_moment_keep_the_order_they_were_appended(backend: Backend) -> None:
    # GIVEN fifty records appended at once, of three events on five VMs
    for number in range(50):
        backend.audit.append(record("event", f"vm-{number % 5}", f"E-{number % 3}", reason=str(number)))

    # WHEN the log is read whole, and for one event
    lines = backend.audit.query()
    of_one_event = backend.audit.query(event_id="e-1")

    # THEN they come in the order they were appended
    assert [line.reason for line in lines] == [str(number) for number in range(50)]
    assert [line.reason for line in of_one_event] == [str(number) for number in range(50) if number % 3 == 1]


def test_an_event_is_found_across_vms_whatever_the_case_of_its_id(backend: Backend) -> None:
    # GIVEN records of one Azure event from two VMs (IMDS prints it in upper case, envelopes in
    # either), and of another event
    backend.audit.append(record("event", "web-0", "C7061BAC-AFDC-4513-B24B-AA5F13A16123"))
    backend.audit.append(record("duplicate", "web-1", "c7061bac-afdc-4513-b24b-aa5f13a16123"))
    backend.audit.append(record("event", "web-0", "OTHER"))

    # WHEN the log is read by event id (in lower case), and by event and VM (in upper case)
    by_event = backend.audit.query(event_id="c7061bac-afdc-4513-b24b-aa5f13a16123")
    by_both = backend.audit.query(vm="web-1", event_id="C7061BAC-AFDC-4513-B24B-AA5F13A16123")

    # THEN every VM's record of the event comes, oldest first, with its id as written
    assert _kinds(by_event) == [
        ("web-0", "C7061BAC-AFDC-4513-B24B-AA5F13A16123", "event"),
        ("web-1", "c7061bac-afdc-4513-b24b-aa5f13a16123", "duplicate"),
    ]
    assert _kinds(by_both) == [("web-1", "c7061bac-afdc-4513-b24b-aa5f13a16123", "duplicate")]
    assert len(backend.audit.query()) == 3


def test_records_round_trip_every_field_at_millisecond_precision(backend: Backend) -> None:
    # GIVEN an approval with every field set and times below the millisecond, and a record of a
    # malformed envelope (no VM, no event, no time to act at)
    precise = NOW + timedelta(microseconds=123_456)
    approval = AuditRecord(
        time=precise,
        kind="action",
        envelope_id="a" * 64,
        event_id="E-1",
        vm="web/0#1",
        action="approve",
        status="scheduled",
        rule="azure-scheduled",
        reason="drained; approve after the drain period",
        at=precise + timedelta(seconds=30),
        detail={"kind": "reboot", "resources": ["web/0#1"], "nested": [[1]], "n": 1.5, "none": None},
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
    )
    malformed = AuditRecord(NOW, "malformed", "b" * 64, "", "", action="none", reason="not JSON")
    backend.audit.append(approval)
    backend.audit.append(malformed)

    # WHEN they are read back
    (stored,) = backend.audit.query(vm="web/0#1")

    # THEN nothing is lost or changed, but the times are kept to the millisecond
    milliseconds = timedelta(microseconds=123_000)
    assert stored == replace(approval, time=NOW + milliseconds, at=NOW + timedelta(seconds=30) + milliseconds)
    assert list(backend.audit.query(vm="")) == [malformed]


def test_a_record_naming_a_thousand_vms_is_cut_appended_and_found(
    backend: Backend, request: pytest.FixtureRequest
) -> None:
    if backend.name == FIRESTORE:
        # Found by its event there, not by its VM: a Firestore query takes no value over 1,500 bytes.
        request.applymarker(pytest.mark.xfail(raises=FirestoreConfigError, strict=True, reason="value too large"))
    # GIVEN a wait for the budget, audited under the VMs of the event it holds back (1,000 names
    # of 80 characters) with a reason of 100,000 characters
    vms = ",".join(f"vmss-{n:04d}-" + "x" * 70 + f"_{n:03d}" for n in range(1000))
    entry = record("action", vms, "E-1", action="wait", reason="r" * 100_000)

    # WHEN it is appended
    backend.audit.append(entry)

    # THEN its texts are cut to what a record keeps, and it is found by its event and under that name
    assert max(len(entry.vm), len(entry.reason)) <= MAX_AUDIT_TEXT
    assert backend.audit.query(event_id="E-1") == [entry]
    assert backend.audit.query(vm="web-0") == []
    assert backend.audit.query(vm=entry.vm) == [entry]


def _reader(backend: Backend) -> AuditReader:
    """The backend's audit log as `mbridge audit` and `mbridge fleet` read it (the core's port has
    neither `query_naming` nor `query_since`)."""
    return cast(AuditReader, backend.audit)


def test_a_vm_s_records_are_every_record_that_names_it_wherever_it_is_filed(backend: Backend) -> None:
    # GIVEN web-0's own records; a report web-2 sent about web-0 and web-1 (refused, filed under its
    # sender); web-1's own report; a wait filed under the two VMs it holds back; and web-10's report
    written = [
        record("event", "web-0", "E-ONE", detail={"resources": ["web-0"]}),
        record("not-self", "web-2", "E-FORGED", action="none", detail={"resources": ["web-0", "web-1"]}),
        record("event", "web-1", "E-TWO", detail={"resources": ["web-1"]}),
        record("action", "web-0,web-1", "E-ONE", action="wait", detail={"resources": ["web-0"]}),
        record("action", "web-0", "E-ONE", action="approve", detail={"resources": ["web-0"]}),
        record("event", "web-10", "E-TEN", detail={"resources": ["web-10"]}),
    ]
    backend.audit.append_all(written[:2])
    for entry in written[2:]:
        backend.audit.append(entry)
    reader = _reader(backend)

    # WHEN one VM's records are read, alone and with an event (in another case than written)
    # THEN every record that names it comes, oldest first, and no other (web-10 is not web-0)
    assert list(reader.query_naming("web-0")) == [written[0], written[1], written[3], written[4]]
    assert list(reader.query_naming("web-1")) == [written[1], written[2], written[3]]
    assert list(reader.query_naming("web-0", event_id="e-forged")) == [written[1]]
    assert list(reader.query_naming("web-1", event_id="e-one")) == [written[3]]
    assert list(reader.query_naming("web-10")) == [written[5]]
    assert list(reader.query_naming("nosuchvm")) == []
    # ... while a query by VM stays the records filed under it
    assert list(reader.query(vm="web-0")) == [written[0], written[4]]


def test_a_trace_s_records_come_oldest_first_and_no_other(backend: Backend) -> None:
    # GIVEN the records of two traces on two VMs, interleaved, and records of no trace
    one, two = "4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c"
    written = [
        record("event", "web-0", "E-ONE", trace_id=one),
        record("event", "web-1", "E-TWO", trace_id=two),
        record("event", "web-2", "E-OLD"),
        record("decision", "web-0", "E-ONE", rule="5-azure-scheduled", trace_id=one),
        record("action", "web-1", "E-TWO", action="drain", trace_id=two),
        record("action", "web-0", "E-ONE", action="approve", trace_id=one),
    ]
    backend.audit.append_all(written[:3])
    for entry in written[3:]:
        backend.audit.append(entry)
    reader = _reader(backend)

    # WHEN one trace's records are read
    # THEN they are those of that trace, in the order written; a trace no record has finds none
    assert list(reader.query_trace(one)) == [written[0], written[3], written[5]]
    assert list(reader.query_trace(two)) == [written[1], written[4]]
    assert list(reader.query_trace("1" * 32)) == []


def _written_now(kind: str, vm: str, event_id: str, **fields: Any) -> AuditRecord:
    """A record of the present moment: a query since a time is by when it was written (Firestore's
    commit time) or its own `time` (SQLite, Table Storage), and here they agree."""
    return replace(record(kind, vm, event_id, **fields), time=datetime.now(timezone.utc))


def test_the_records_since_a_moment_come_oldest_first_by_vm_or_all(backend: Backend) -> None:
    # GIVEN records written before a moment, and others after it, of two VMs
    backend.audit.append_all([_written_now("event", f"web-{n % 2}", "E-OLD", reason=str(n)) for n in range(4)])
    time.sleep(0.05)
    moment = datetime.now(timezone.utc)
    time.sleep(0.05)
    after = [_written_now("event", f"web-{n % 2}", "E-NEW", reason=str(n)) for n in range(5)]
    for entry in after:  # one write each: by Firestore's commit time they follow one another
        backend.audit.append(entry)

    # WHEN the log is read since the moment, whole and by VM, with room to spare
    reader = _reader(backend)
    since = reader.query_since(moment, most=100)
    of_one_vm = reader.query_since(moment, most=100, vm="web-1")

    # THEN only the later records come, in the order written
    assert [line.reason for line in since] == ["0", "1", "2", "3", "4"]
    assert {line.event_id for line in since} == {"E-NEW"}
    assert [line.reason for line in of_one_vm] == ["1", "3"]


def test_the_records_since_a_moment_are_never_more_than_asked(backend: Backend) -> None:
    # GIVEN a dozen records of one VM, written after a moment
    moment = datetime.now(timezone.utc) - timedelta(seconds=1)
    backend.audit.append_all([_written_now("action", "web-0", "E-1", reason=str(n)) for n in range(12)])

    # WHEN the log is read since the moment, at most five and at most twelve
    reader = _reader(backend)

    # THEN five come (the caller asks for one more than it shows to know it was cut), then all twelve
    assert len(reader.query_since(moment, most=5)) == 5
    assert len(reader.query_since(moment, most=5, vm="web-0")) == 5
    assert [line.reason for line in reader.query_since(moment, most=12)] == [str(n) for n in range(12)]
    assert reader.query_since(datetime.now(timezone.utc) + timedelta(minutes=5), most=5) == []
