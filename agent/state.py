"""The agent's durable state: the outbox and the sources' last observations, in one SQLite file.

Writing the new source state and the envelopes it produced in ONE transaction is what
makes the agent lose nothing and double nothing:
- a crash before the commit leaves the old state, so the same change is diffed again
  after the restart and produces the same envelopes (same ids, docs/contracts.md#deterministic-ids);
- a crash after the commit leaves the envelopes in the outbox, published on restart;
- a crash between the bus accepting an envelope and the row being marked published
  publishes it again, with the same id, which the bus and the functions deduplicate.
WAL mode keeps readers (health, metrics) from blocking the writer.

A write that fails for lack of space or an I/O error raises StateUnavailableError and leaves
everything as it was: the caller keeps what it wanted to write and tries again (agent.loop).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.state_files import open_database, writing
from wire.transports.base import OutboundMessage

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    envelope_id  TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    body         BLOB    NOT NULL,
    attributes   TEXT    NOT NULL,
    observed_at  REAL    NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT,
    published_at REAL
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (published_at, seq);
CREATE TABLE IF NOT EXISTS source_state (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class PendingMessage:
    seq: int
    message: OutboundMessage
    observed_at: float  # epoch seconds, for publish-lag metrics
    attempts: int


class AgentState:
    """Outbox rows and named source states. Thread-safe (one connection, one lock)."""

    def __init__(self, path: Path) -> None:
        """Open (or make) the state at `path`; a file that cannot be used is moved aside.

        Raises:
            StateDirError: its directory cannot be used (a configuration error).
            StateUnavailableError: a full disk or an I/O error; try again later.
        """
        self.path = path
        self._lock = threading.Lock()
        self._db = open_database(path, schema=SCHEMA)
        self._changed = threading.Condition(self._lock)
        # Counts the records that added rows (and the interruptions): the publisher reads it before
        # it looks for a row, and waits only while it is unchanged, so a row recorded between its
        # look and its wait is never slept through.
        self._generation = 0

    def load(self, name: str) -> Any | None:
        """The JSON value last saved under `name`, or None."""
        with self._lock:
            row = self._db.execute("SELECT value FROM source_state WHERE name = ?", (name,)).fetchone()
        return None if row is None else json.loads(row[0])

    def record(
        self,
        messages: Iterable[tuple[OutboundMessage, float]],
        states: Mapping[str, Any] | None = None,
    ) -> int:
        """Atomically save source states and append (message, observed_at epoch) rows, in order.

        Returns the number of rows appended.
        """
        rows = [
            (m.envelope_id, m.key, m.body, json.dumps(dict(m.attributes), sort_keys=True), observed)
            for m, observed in messages
        ]
        with self._changed:
            with writing(self.path):
                self._write_together(rows, states or {})
            if rows:
                self._generation += 1
                self._changed.notify_all()
        return len(rows)

    def _write_together(self, rows: list[tuple[Any, ...]], states: Mapping[str, Any]) -> None:
        """One transaction: all of it is written or nothing. The caller holds the lock."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for name, value in states.items():
                self._db.execute(
                    "INSERT INTO source_state (name, value) VALUES (?, ?) "
                    "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                    (name, json.dumps(value, sort_keys=True)),
                )
            self._db.executemany(
                "INSERT INTO outbox (envelope_id, key, body, attributes, observed_at) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            self._db.execute("COMMIT")
        except BaseException:
            # SQLite rolls the transaction back itself after some errors, a full disk among them;
            # a ROLLBACK then fails ("no transaction is active") and would hide the cause.
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def next_pending(self) -> PendingMessage | None:
        """The oldest unpublished row: publishing strictly in order keeps per-VM order."""
        with self._lock:
            row = self._db.execute(
                "SELECT seq, envelope_id, key, body, attributes, observed_at, attempts FROM outbox "
                "WHERE published_at IS NULL ORDER BY seq LIMIT 1"
            ).fetchone()
        if row is None:
            return None
        seq, envelope_id, key, body, attributes, observed_at, attempts = row
        message = OutboundMessage(envelope_id=envelope_id, body=bytes(body), key=key, attributes=json.loads(attributes))
        return PendingMessage(seq=seq, message=message, observed_at=observed_at, attempts=attempts)

    def generation(self) -> int:
        """A number that changes whenever rows are recorded (or waits are interrupted)."""
        with self._lock:
            return self._generation

    def wait_for_record(self, after: int, timeout: float | None) -> None:
        """Block until `generation()` differs from `after` or `timeout` passes (the publisher's idle
        wait: no timer while nothing is recorded)."""
        with self._changed:
            self._changed.wait_for(lambda: self._generation != after, timeout)

    def interrupt_waits(self) -> None:
        """Wake `wait_for_record` callers now (the agent is stopping)."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def mark_published(self, seq: int, at: float) -> None:
        with self._lock, writing(self.path):
            self._db.execute("UPDATE outbox SET published_at = ?, last_error = NULL WHERE seq = ?", (at, seq))

    def mark_failed(self, seq: int, error: str) -> None:
        with self._lock, writing(self.path):
            self._db.execute(
                "UPDATE outbox SET attempts = attempts + 1, last_error = ? WHERE seq = ?", (error[:500], seq)
            )

    def depth(self) -> int:
        """Rows not yet accepted by the bus."""
        with self._lock:
            (count,) = self._db.execute("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL").fetchone()
        return int(count)

    def prune(self, published_before: float) -> int:
        """Forget rows the bus accepted before `published_before` (epoch seconds)."""
        with self._lock, writing(self.path):
            cursor = self._db.execute(
                "DELETE FROM outbox WHERE published_at IS NOT NULL AND published_at < ?", (published_before,)
            )
        return cursor.rowcount

    def messages(self) -> list[OutboundMessage]:
        """Every row still kept, published or not, in order (for inspection and tests)."""
        with self._lock:
            rows = self._db.execute("SELECT envelope_id, key, body, attributes FROM outbox ORDER BY seq").fetchall()
        return [
            OutboundMessage(envelope_id=r[0], key=r[1], body=bytes(r[2]), attributes=json.loads(r[3])) for r in rows
        ]

    def close(self) -> None:
        with self._lock:
            self._db.close()
