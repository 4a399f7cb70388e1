"""SQLite implementations of StateStore and AuditLog (one file, WAL; ":memory:" for replay).

Each method runs in its own IMMEDIATE transaction, so concurrent consumers of one file never
admit two events into the last budget slot, nor take the same claim twice.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from functions.core.audit_codec import AUDIT_FIELDS, also_named, audit_fields, audit_record, vms_named
from functions.core.ports import (
    Admission,
    AuditRecord,
    Claim,
    Finishing,
    Glance,
    JsonObject,
    Parked,
    RecordedDrain,
    Reservation,
)
from functions.core.store_rules import DONE, IN_PROGRESS, Finish, claim_found, glance_each, joined, legacy_expiry
from wire.timefmt import format_rfc3339

# Columns added since files were first made: (table, column, type). A file made before gets them
# when it is opened; its rows have NULL there (a reservation without expiry: see `reserve`).
_ADDED_COLUMNS = (
    ("reservations", "admitted_at", "REAL"),
    ("reservations", "expires_at", "REAL"),
    # An audit row written before traces were kept reads back with no trace ("").
    ("audit", "trace_id", "TEXT NOT NULL DEFAULT ''"),
)

# The small keyed tables are WITHOUT ROWID: one b-tree each instead of a table and its key's index,
# so a write touches half the pages. The audit's seq is a plain INTEGER PRIMARY KEY (the rowid):
# rows are never deleted, so it only grows, and AUTOINCREMENT would write sqlite_sequence on every
# append. (Files made before keep their tables as they were; the statements below suit both.)
# There is no index on the audit's event_id: event ids match case-insensitively (Azure's are GUIDs
# in any case), which an index on the column cannot serve, so it only cost every append a sixth of
# its time. Files made before lose theirs.
SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (
    key TEXT PRIMARY KEY, state TEXT NOT NULL, lease_until REAL NOT NULL, updated_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reservations (
    pool TEXT NOT NULL, event_key TEXT NOT NULL, vms TEXT NOT NULL, admitted_at REAL, expires_at REAL,
    PRIMARY KEY (pool, event_key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS drains (
    event_key TEXT NOT NULL, vm TEXT NOT NULL, memento TEXT NOT NULL, PRIMARY KEY (event_key, vm)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS remembered (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS parked (
    pool TEXT NOT NULL, event_key TEXT NOT NULL, envelope BLOB NOT NULL, parked_at REAL NOT NULL,
    PRIMARY KEY (pool, event_key)
);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY, time TEXT NOT NULL, kind TEXT NOT NULL, envelope_id TEXT NOT NULL,
    event_id TEXT NOT NULL, vm TEXT NOT NULL, action TEXT NOT NULL, status TEXT NOT NULL, rule TEXT NOT NULL,
    reason TEXT NOT NULL, at TEXT, detail TEXT NOT NULL, trace_id TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS audit_vm ON audit (vm, seq);
DROP INDEX IF EXISTS audit_event;
CREATE TABLE IF NOT EXISTS dead_letters (
    envelope_id TEXT PRIMARY KEY, bus_seq INTEGER NOT NULL, body BLOB NOT NULL, reason TEXT NOT NULL,
    failed_at REAL NOT NULL
);
"""


# A pool's reservations other than this event's, and how many VMs would be drained in the pool
# with this event's VMs (each counted once): SQLite counts them in one query, instead of every
# open event's VM list being parsed in Python for each reservation.
_POOL_USE = """
SELECT
    (SELECT COUNT(*) FROM reservations WHERE pool = ?),
    (SELECT COUNT(*) FROM (
        SELECT held.value FROM reservations, json_each(reservations.vms) AS held WHERE reservations.pool = ?
        UNION SELECT value FROM json_each(?)
    ))
"""

_AUDIT_COLUMNS = ", ".join(AUDIT_FIELDS)
# The audit codec's fields by name; an empty `at` is NULL, as rows always had it.
_AUDIT_VALUES = ", ".join("NULLIF(:at, '')" if name == "at" else f":{name}" for name in AUDIT_FIELDS)
_AUDIT_INSERT = f"INSERT INTO audit ({_AUDIT_COLUMNS}) VALUES ({_AUDIT_VALUES})"  # noqa: S608 (fixed names only)

# The VMs a record names besides its `vm` (audit_codec.also_named), one row each: one VM's view is its
# rows of `audit_vm` and of this table, both read by index. Most records name their own VM alone and
# add no row here. A file made before this table gets it filled from its records when opened
# (`_name_earlier_records`).
_AUDIT_NAMED_TABLE = """
CREATE TABLE audit_named (vm TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (vm, seq)) WITHOUT ROWID
"""
_AUDIT_NAMED_INSERT = "INSERT OR IGNORE INTO audit_named (vm, seq) VALUES (?, ?)"
# SQLite answers the OR with both indexes (a MULTI-INDEX OR), never a scan of the log.
_AUDIT_NAMING = (
    f"SELECT {_AUDIT_COLUMNS} FROM audit "  # noqa: S608 (fixed names only)
    "WHERE (vm = :vm OR seq IN (SELECT seq FROM audit_named WHERE vm = :vm))"
)


def _parsed(detail: str) -> object:
    """A stored `detail`, or nothing when it is not JSON (a file edited by hand must still open)."""
    try:
        return json.loads(detail)
    except ValueError:
        return None


def _reservation(event_key: str, vms: str, admitted_at: float | None, expires_at: float) -> Reservation:
    admitted = None if admitted_at is None else datetime.fromtimestamp(admitted_at, timezone.utc)
    return Reservation(event_key, tuple(json.loads(vms)), admitted, datetime.fromtimestamp(expires_at, timezone.utc))


@dataclass(frozen=True)
class DeadLetter:
    """A message of the embedded bus that the local host could not process and will not retry."""

    envelope_id: str
    bus_seq: int
    body: bytes
    reason: str
    failed_at: datetime


class SqliteStore:
    """StateStore and AuditLog over one SQLite database."""

    def __init__(self, path: Path | str) -> None:
        target = str(path)
        if target != ":memory:":
            Path(target).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(target, timeout=30, check_same_thread=False, isolation_level=None)
        if target != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
            # In WAL mode NORMAL loses nothing when the process dies, only the last commits on a power
            # cut; FULL syncs every commit and costs two thirds of the throughput (bench/throughput.py).
            # This is the store of one machine (the embedded bus, tests); the cloud stores are Table
            # Storage and Firestore.
            self._db.execute("PRAGMA synchronous=NORMAL")
            # With NORMAL, checkpoints are where the fsyncs happen: one per 4,000 pages written
            # (a WAL of up to 16 MB) instead of SQLite's default 1,000 gives the core 8 % more.
            self._db.execute("PRAGMA wal_autocheckpoint=4000")
        self._db.executescript(SCHEMA)
        for table, column, kind in _ADDED_COLUMNS:
            if column not in {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        self._name_earlier_records()

    def _name_earlier_records(self) -> None:
        """Make `audit_named` in a file made before it, filled from the records already there; in one
        transaction, so that of two processes opening the file at once, the second finds it done.
        A file that has it is only read: opening it takes no write lock."""
        if self._has_named_table():
            return
        with self._transaction() as db:
            if self._has_named_table():
                return
            db.execute(_AUDIT_NAMED_TABLE)
            earlier = db.execute("SELECT seq, vm, detail FROM audit")
            db.executemany(
                _AUDIT_NAMED_INSERT,
                ((name, seq) for seq, vm, detail in earlier for name in vms_named(vm, _parsed(detail)) if name != vm),
            )

    def _has_named_table(self) -> bool:
        found = self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'audit_named'")
        return found.fetchone() is not None

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # ---- claims

    def claim(self, key: str, now: datetime, lease: timedelta) -> Claim:
        stamp = now.timestamp()
        with self._transaction() as db:
            row = db.execute("SELECT state, lease_until FROM claims WHERE key = ?", (key,)).fetchone()
            state, lease_until = row or (None, None)
            found = claim_found(state, lease_until, stamp)
            if found is not Claim.CLAIMED:
                return found
            db.execute(
                "INSERT INTO claims (key, state, lease_until, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET state = excluded.state, lease_until = excluded.lease_until, "
                "updated_at = excluded.updated_at",
                (key, IN_PROGRESS, stamp + lease.total_seconds(), stamp),
            )
            return Claim.CLAIMED

    def finishing(self, key: str, now: datetime, forgotten: Sequence[tuple[str, str]] = ()) -> Finishing:
        return Finish(self, self, key, now, tuple(forgotten))

    def complete(self, key: str, now: datetime) -> None:
        with self._transaction() as db:
            db.execute("UPDATE claims SET state = ?, updated_at = ? WHERE key = ?", (DONE, now.timestamp(), key))

    def abandon(self, key: str, now: datetime) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE claims SET lease_until = ?, updated_at = ? WHERE key = ? AND state = ?",
                (now.timestamp(), now.timestamp(), key, IN_PROGRESS),
            )

    # ---- budget

    def reserve(
        self,
        pool: str,
        event_key: str,
        vms: Sequence[str],
        limit: int | None,
        *,
        now: datetime,
        expires_at: datetime,
        alone: bool = False,
        seen: object | None = None,
    ) -> Admission:
        # `alone` changes nothing here: a VM joins its event's reservation in the same transaction.
        # `seen` neither: the transaction reads the pool's reservations itself.
        del alone, seen
        stamp = now.timestamp()
        with self._transaction() as db:
            # A reservation of an earlier version (no expiry) gets one; then the expired ones go.
            db.execute(
                "UPDATE reservations SET expires_at = ? WHERE pool = ? AND expires_at IS NULL",
                (legacy_expiry(now).timestamp(), pool),
            )
            gone = db.execute(
                "SELECT event_key, vms, admitted_at, expires_at FROM reservations WHERE pool = ? AND expires_at <= ?",
                (pool, stamp),
            ).fetchall()
            if gone:
                db.execute("DELETE FROM reservations WHERE pool = ? AND expires_at <= ?", (pool, stamp))
            expired = tuple(sorted((_reservation(*row) for row in gone), key=lambda held: held.event_key))
            held = db.execute(
                "SELECT vms FROM reservations WHERE pool = ? AND event_key = ?", (pool, event_key)
            ).fetchone()
            if held:
                # Admitted already: another VM of the event joins it (each VM's own report drains it).
                db.execute(
                    "UPDATE reservations SET vms = ? WHERE pool = ? AND event_key = ?",
                    (json.dumps(joined(json.loads(held[0]), vms)), pool, event_key),
                )
                return Admission(True, expired)
            if limit is not None:
                others, drained = db.execute(_POOL_USE, (pool, pool, json.dumps(list(vms)))).fetchone()
                if others and drained > limit:
                    return Admission(False, expired)
            db.execute(
                "INSERT INTO reservations (pool, event_key, vms, admitted_at, expires_at) VALUES (?, ?, ?, ?, ?)",
                (pool, event_key, json.dumps(list(vms)), stamp, expires_at.timestamp()),
            )
            return Admission(True, expired)

    def release(self, pool: str, event_key: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM reservations WHERE pool = ? AND event_key = ?", (pool, event_key))

    # ---- drains

    def record_drain(self, event_key: str, vm: str, memento: JsonObject) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO drains (event_key, vm, memento) VALUES (?, ?, ?)",
                (event_key, vm, json.dumps(memento, sort_keys=True)),
            )

    def record_drain_unless(self, event_key: str, vm: str, memento: JsonObject, ended: str) -> bytes | None:
        with self._transaction() as db:
            row = db.execute("SELECT value FROM remembered WHERE key = ?", (ended,)).fetchone()
            if row is not None:
                return bytes(row[0])
            db.execute(
                "INSERT OR REPLACE INTO drains (event_key, vm, memento) VALUES (?, ?, ?)",
                (event_key, vm, json.dumps(memento, sort_keys=True)),
            )
            return None

    def glance(
        self, recall: Sequence[str], event_key: str = "", vms: Sequence[str] = (), pools: Sequence[str] = ()
    ) -> Glance:
        # Reads of one local file: no request to save. The budget is read by `reserve`'s transaction.
        del pools
        return glance_each(self, self, recall, event_key, vms)

    def drains(self, event_key: str) -> Mapping[str, JsonObject]:
        with self._lock:
            rows = self._db.execute("SELECT vm, memento FROM drains WHERE event_key = ?", (event_key,)).fetchall()
        return {vm: json.loads(memento) for vm, memento in rows}

    def forget_drain(self, event_key: str, vm: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM drains WHERE event_key = ? AND vm = ?", (event_key, vm))

    def all_drains(self) -> Sequence[RecordedDrain]:
        with self._lock:
            rows = self._db.execute("SELECT event_key, vm, memento FROM drains ORDER BY event_key, vm").fetchall()
        return [RecordedDrain(event_key, vm, json.loads(memento)) for event_key, vm, memento in rows]

    # ---- remembered values and waits

    def remember(self, key: str, value: bytes) -> bytes:
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO remembered (key, value) VALUES (?, ?)", (key, value))
            (stored,) = db.execute("SELECT value FROM remembered WHERE key = ?", (key,)).fetchone()
        return bytes(stored)

    def recall(self, key: str) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM remembered WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def park(self, pool: str, event_key: str, envelope: bytes, now: datetime) -> None:
        with self._transaction() as db:
            # A later step of a waiting event replaces its envelope but keeps its place in line.
            db.execute(
                "INSERT INTO parked (pool, event_key, envelope, parked_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(pool, event_key) DO UPDATE SET envelope = excluded.envelope",
                (pool, event_key, envelope, now.timestamp()),
            )

    def parked(self, pool: str) -> Sequence[Parked]:
        with self._lock:
            rows = self._db.execute(
                "SELECT event_key, envelope, parked_at FROM parked WHERE pool = ? ORDER BY parked_at, event_key",
                (pool,),
            ).fetchall()
        return [Parked(key, bytes(envelope), datetime.fromtimestamp(at, timezone.utc)) for key, envelope, at in rows]

    def unpark(self, pool: str, event_key: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM parked WHERE pool = ? AND event_key = ?", (pool, event_key))

    # ---- messages set aside (the local host's dead-letter queue)

    def dead_letter(self, letter: DeadLetter) -> None:
        """Keep a message the host gives up on; the first reason given for an envelope stays."""
        with self._transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO dead_letters (envelope_id, bus_seq, body, reason, failed_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (letter.envelope_id, letter.bus_seq, letter.body, letter.reason, letter.failed_at.timestamp()),
            )

    def dead_letters(self) -> Sequence[DeadLetter]:
        with self._lock:
            rows = self._db.execute(
                "SELECT envelope_id, bus_seq, body, reason, failed_at FROM dead_letters ORDER BY bus_seq"
            ).fetchall()
        return [
            DeadLetter(envelope_id, seq, bytes(body), reason, datetime.fromtimestamp(at, timezone.utc))
            for envelope_id, seq, body, reason, at in rows
        ]

    # ---- audit

    def append(self, record: AuditRecord) -> None:
        self.append_all([record])

    def append_all(self, records: Sequence[AuditRecord], then: Finishing | None = None) -> None:
        if records:
            with self._transaction() as db:
                for record in records:
                    written = db.execute(_AUDIT_INSERT, audit_fields(record))
                    others = also_named(record)
                    if others:
                        db.executemany(_AUDIT_NAMED_INSERT, [(name, written.lastrowid) for name in others])
        if then is not None:
            then.write()

    def query(self, *, vm: str | None = None, event_id: str | None = None) -> Sequence[AuditRecord]:
        clauses, params = [], []
        if vm is not None:
            clauses.append("vm = ?")
            params.append(vm)
        if event_id is not None:
            clauses.append("lower(event_id) = lower(?)")
            params.append(event_id)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        # The clauses are fixed strings; every value is a parameter.
        sql = f"SELECT {_AUDIT_COLUMNS} FROM audit{where} ORDER BY seq"  # noqa: S608
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        return [audit_record(dict(zip(AUDIT_FIELDS, row))) for row in rows]

    def query_naming(self, vm: str, *, event_id: str | None = None) -> Sequence[AuditRecord]:
        """The records that name `vm` (audit_codec.names), of one event or all, oldest first: those
        filed under it and those filed under another VM that name it (`audit_named`)."""
        sql, params = _AUDIT_NAMING, {"vm": vm, "event_id": event_id}
        if event_id is not None:
            sql += " AND lower(event_id) = lower(:event_id)"
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY seq", params).fetchall()
        return [audit_record(dict(zip(AUDIT_FIELDS, row))) for row in rows]

    def query_trace(self, trace_id: str) -> Sequence[AuditRecord]:
        """The records of one trace (`trace_id`), oldest first (`mbridge audit list --trace`). No index
        serves it: SQLite reads the whole local table, which stays small."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_AUDIT_COLUMNS} FROM audit WHERE trace_id = ? ORDER BY seq",  # noqa: S608 (fixed names only)
                (trace_id,),
            ).fetchall()
        return [audit_record(dict(zip(AUDIT_FIELDS, row))) for row in rows]

    def query_since(self, since: datetime, *, most: int, vm: str | None = None) -> Sequence[AuditRecord]:
        """The records from `since` on (by their `time`), oldest first, at most `most` of them: a view of
        the whole log that reads only what it shows (`mbridge fleet`)."""
        clauses, params = ["julianday(time) >= julianday(?)"], [format_rfc3339(since)]
        if vm is not None:
            clauses.append("vm = ?")
            params.append(vm)
        # The clauses are fixed strings; every value is a parameter.
        sql = f"SELECT {_AUDIT_COLUMNS} FROM audit WHERE {' AND '.join(clauses)} ORDER BY seq LIMIT ?"  # noqa: S608
        with self._lock:
            rows = self._db.execute(sql, [*params, max(0, most)]).fetchall()
        return [audit_record(dict(zip(AUDIT_FIELDS, row))) for row in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
