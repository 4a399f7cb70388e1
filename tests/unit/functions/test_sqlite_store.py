"""The local SQLite store opens files made by earlier versions of its schema and goes on with them.

What it does as a StateStore and an AuditLog is the contract suite of every store:
tests/contract/test_state_store.py and tests/contract/test_audit_log.py.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from functions.core.holds import LONGEST_HOLD
from functions.core.ports import AuditRecord, Claim, Reservation
from functions.local_app.store import _AUDIT_NAMING, SqliteStore

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
HELD_UNTIL = NOW + timedelta(hours=1)

# The schema as the first release wrote it: rowid tables, AUTOINCREMENT, an index on event_id.
EARLIER_SCHEMA = """
CREATE TABLE claims (key TEXT PRIMARY KEY, state TEXT NOT NULL, lease_until REAL NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE reservations (
    pool TEXT NOT NULL, event_key TEXT NOT NULL, vms TEXT NOT NULL, PRIMARY KEY (pool, event_key)
);
CREATE TABLE drains (event_key TEXT NOT NULL, vm TEXT NOT NULL, memento TEXT NOT NULL, PRIMARY KEY (event_key, vm));
CREATE TABLE audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, time TEXT NOT NULL, kind TEXT NOT NULL, envelope_id TEXT NOT NULL,
    event_id TEXT NOT NULL, vm TEXT NOT NULL, action TEXT NOT NULL, status TEXT NOT NULL, rule TEXT NOT NULL,
    reason TEXT NOT NULL, at TEXT, detail TEXT NOT NULL
);
CREATE INDEX audit_vm ON audit (vm, seq);
CREATE INDEX audit_event ON audit (event_id, seq);
INSERT INTO claims VALUES ('envelope-1', 'done', 0, 0);
INSERT INTO reservations VALUES ('web', 'azure:e-old', '["web-0"]');
INSERT INTO audit (time, kind, envelope_id, event_id, vm, action, status, rule, reason, at, detail)
VALUES ('2026-03-01T11:00:00Z', 'event', 'envelope-1', 'E-OLD', 'web-0', 'none', 'scheduled', '', '', NULL, '{}');
"""


def record(event_id: str, vm: str) -> AuditRecord:
    return AuditRecord(NOW, "event", f"envelope-{event_id}", event_id, vm, action="none")


def test_a_file_from_the_earlier_schema_keeps_its_state_and_takes_new_records(tmp_path: Path) -> None:
    # GIVEN a store file written by the earlier schema, with a claim, a reservation and an audit line
    path = tmp_path / "functions.db"
    with sqlite3.connect(path) as earlier:
        earlier.executescript(EARLIER_SCHEMA)
    earlier.close()
    # WHEN this version opens it and works on it
    store = SqliteStore(path)
    try:
        claimed_before = store.claim("envelope-1", NOW, timedelta(minutes=5))
        budget_full = not store.reserve("web", "azure:e-new", ["web-1"], 1, now=NOW, expires_at=HELD_UNTIL)
        # (the earlier reservation has no expiry: it holds the longest hold from when it was first found)
        half_way = NOW + LONGEST_HOLD / 2
        still_full = not store.reserve("web", "azure:e-new", ["web-1"], 1, now=half_way, expires_at=HELD_UNTIL)
        freed = store.reserve("web", "azure:e-new", ["web-1"], 1, now=NOW + LONGEST_HOLD, expires_at=HELD_UNTIL)
        store.append(replace(record("e-new", "web-1"), trace_id="4bf92f3577b34da6a3ce929d0e0e4736"))
        by_event = store.query(event_id="e-old")
        by_vm = store.query(vm="web-1")
        indexes = {row[0] for row in store._db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    finally:
        store.close()
    # THEN what was there is still there, new records follow the old ones, and the unused index is gone
    assert claimed_before is Claim.DONE
    assert budget_full
    assert still_full
    assert freed
    assert freed.expired == (Reservation("azure:e-old", ("web-0",), None, NOW + LONGEST_HOLD),)
    assert [line.event_id for line in by_event] == ["E-OLD"]  # event ids match case-insensitively
    assert [line.event_id for line in by_vm] == ["e-new"]
    # (a record written before trace ids has none; one written now keeps its own)
    assert [line.trace_id for line in (*by_event, *by_vm)] == ["", "4bf92f3577b34da6a3ce929d0e0e4736"]
    assert "audit_event" not in indexes
    assert "audit_vm" in indexes


def test_a_file_written_before_records_were_found_by_every_vm_they_name_finds_its_old_records(
    tmp_path: Path,
) -> None:
    # GIVEN a store file of the earlier schema holding a report web-2 sent about web-0 and web-1
    # (filed under web-2) and a wait filed under the two VMs it held back
    path = tmp_path / "functions.db"
    with sqlite3.connect(path) as earlier:
        earlier.executescript(EARLIER_SCHEMA)
        earlier.executemany(
            "INSERT INTO audit (time, kind, envelope_id, event_id, vm, action, status, rule, reason, at, detail)"
            " VALUES ('2026-03-01T11:00:01Z', ?, 'envelope-2', 'E-FORGED', ?, ?, '', '', '', NULL, ?)",
            [
                ("not-self", "web-2", "none", '{"resources": ["web-0", "web-1"]}'),
                ("action", "web-0,web-1", "wait", '{"resources": ["web-0"]}'),
            ],
        )
    earlier.close()

    # WHEN this version opens it (twice: the second finds nothing left to do) and takes a new record
    SqliteStore(path).close()
    store = SqliteStore(path)
    try:
        store.append(AuditRecord(NOW, "event", "envelope-3", "E-NEW", "web-1", detail={"resources": ["web-1"]}))
        of_web_0 = store.query_naming("web-0")
        of_web_1 = store.query_naming("web-1")
    finally:
        store.close()

    # THEN each VM's records are the old ones that name it, then the new, each once
    assert [(line.event_id, line.vm) for line in of_web_0] == [
        ("E-OLD", "web-0"),
        ("E-FORGED", "web-2"),
        ("E-FORGED", "web-0,web-1"),
    ]
    assert [(line.event_id, line.vm) for line in of_web_1] == [
        ("E-FORGED", "web-2"),
        ("E-FORGED", "web-0,web-1"),
        ("E-NEW", "web-1"),
    ]


def test_one_vm_s_records_are_read_by_index_never_by_a_scan_of_the_log(tmp_path: Path) -> None:
    # GIVEN the store's query of the records that name a VM
    store = SqliteStore(tmp_path / "functions.db")
    try:
        # WHEN SQLite says how it would answer it, alone and with an event
        plans = [
            [row[3] for row in store._db.execute(f"EXPLAIN QUERY PLAN {sql}", {"vm": "web-0", "event_id": "E"})]
            for sql in (_AUDIT_NAMING, _AUDIT_NAMING + " AND lower(event_id) = lower(:event_id)")
        ]
    finally:
        store.close()
    # THEN it searches the audit by its VM index and by the rows of the VMs named, and scans nothing
    for plan in plans:
        assert not [step for step in plan if step.startswith("SCAN")], plan
        assert any("USING INDEX audit_vm" in step for step in plan), plan
        assert any("SEARCH audit_named USING PRIMARY KEY" in step for step in plan), plan
