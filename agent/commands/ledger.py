"""The command ledger: every command this agent took on, by command_id, in one SQLite file (WAL).

The processor's memory across messages and restarts (replay, held commands, results not yet
published); kept apart because it is storage, with its own schema and migrations.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum
from pathlib import Path
from typing import Any

from agent.state_files import open_database, writing
from agent.timing import Clock, SystemClock
from wire.commands import Command, ReceivedCommand, decode_command
from wire.errors import PermanentError
from wire.model import CommandResult

LOGGER = logging.getLogger("mbridge.commands")

DEFAULT_RETENTION = timedelta(hours=24)
LEDGER_SCHEMA_VERSION = 1


class LedgerError(PermanentError):
    """The command ledger was written by a newer agent; the message says what to do."""


class EntryState(str, Enum):
    HELD = "held"  # waiting for execute_at
    EXECUTING = "executing"  # side effects may have started; no final result yet
    DONE = "done"  # final result stored


@dataclass(frozen=True)
class LedgerEntry:
    command_id: str
    digest: str
    state: EntryState
    body: bytes
    execute_at: datetime | None
    expires_at: datetime
    attempts: int
    result: CommandResult | None
    trace_id: str | None = None  # the trace of the command's maintenance, when it carried one


SCHEMA = """
CREATE TABLE IF NOT EXISTS commands (
    command_id  TEXT PRIMARY KEY,
    digest      TEXT NOT NULL,     -- SHA-256 of the canonical bytes: replay vs reused id
    state       TEXT NOT NULL CHECK (state IN ('held', 'executing', 'done')),
    body        BLOB NOT NULL,     -- the message body as received (held commands run from it)
    type        TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    execute_at  REAL,              -- Unix seconds; set while held
    expires_at  REAL NOT NULL,     -- Unix seconds
    received_at REAL NOT NULL,
    updated_at  REAL NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    accepted    INTEGER,           -- 1 / 0 once done
    reason      TEXT,
    result_target   TEXT,
    result_event_id TEXT,
    reported    INTEGER NOT NULL DEFAULT 0  -- 1 once the result is in the agent's outbox
);
CREATE INDEX IF NOT EXISTS commands_due ON commands (state, execute_at);
"""
# Columns added since ledgers were first made, out of SCHEMA (what a file must have to be used, or
# it is moved aside): a ledger made before gets them when it is opened, without a new schema
# version. Every statement names its columns, so an older agent rolled back to still reads and
# writes the ledger, and leaves them NULL.
#   trace_id: the trace of the command's maintenance (wire/tracecontext.py), when it carried one
_ADDED_COLUMNS = (("trace_id", "TEXT"),)

_SELECT = (
    "SELECT command_id, digest, state, body, execute_at, expires_at, attempts, accepted, reason, result_target, "
    "result_event_id, trace_id FROM commands"
)


class CommandLedger:
    """Every command this agent took on, by command_id, in one SQLite file (WAL).

    Thread-safe (one connection behind a lock): the command loop writes, the status page reads.
    Finished entries are pruned `retention` after they finished, but never before the command
    expired, so an id is remembered for as long as a replay could still pass the expiry check.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        retention: timedelta = DEFAULT_RETENTION,
    ) -> None:
        self._path = os.fspath(path)
        self._clock: Clock = clock or SystemClock()
        self._retention = retention
        self._lock = threading.Lock()
        # Synchronous FULL, as "executing" must be on disk before an approval is POSTed; a file that
        # cannot be used is moved aside (agent.state_files).
        self._db = open_database(Path(self._path), schema=SCHEMA, prepare=self._migrate)
        self.prune()

    def _migrate(self, db: sqlite3.Connection) -> None:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version > LEDGER_SCHEMA_VERSION:
            raise LedgerError(
                f"the command ledger {self._path} has schema version {version}, newer than this agent "
                f"({LEDGER_SCHEMA_VERSION}): upgrade maintenance-bridge"
            )
        db.executescript(SCHEMA)
        present = {row[1] for row in db.execute("PRAGMA table_info(commands)")}
        for column, kind in _ADDED_COLUMNS:
            if column not in present:
                db.execute(f"ALTER TABLE commands ADD COLUMN {column} {kind}")
        db.execute(f"PRAGMA user_version = {LEDGER_SCHEMA_VERSION}")

    # ---- reads

    def get(self, command_id: str) -> LedgerEntry | None:
        with self._lock:
            row = self._db.execute(_SELECT + " WHERE command_id = ?", (command_id,)).fetchone()
        return None if row is None else _entry(row)

    def due(self, now: datetime) -> list[LedgerEntry]:
        """Held commands whose execute_at has come, oldest first."""
        with self._lock:
            rows = self._db.execute(
                _SELECT + " WHERE state = 'held' AND execute_at <= ? ORDER BY execute_at, received_at",
                (now.timestamp(),),
            ).fetchall()
        return [_entry(row) for row in rows]

    def next_due_at(self) -> datetime | None:
        with self._lock:
            (moment,) = self._db.execute("SELECT MIN(execute_at) FROM commands WHERE state = 'held'").fetchone()
        return None if moment is None else _from_epoch(moment)

    def held(self) -> list[Command]:
        """The commands waiting for their execute_at, soonest first (for status pages)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT body FROM commands WHERE state = 'held' ORDER BY execute_at, received_at"
            ).fetchall()
        return [decode_command(bytes(body)).command for (body,) in rows]

    # ---- writes

    def hold(self, received: ReceivedCommand, execute_at: datetime) -> None:
        """Store a command to run at `execute_at` (a new one, or one to retry later)."""
        now = self._now()
        command = received.command
        with self._lock, writing(self._path):
            self._db.execute(
                "INSERT INTO commands (command_id, digest, state, body, type, event_id, execute_at, expires_at, "
                "received_at, updated_at, trace_id) VALUES (?, ?, 'held', ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (command_id) DO UPDATE SET state = 'held', execute_at = excluded.execute_at, "
                "updated_at = excluded.updated_at WHERE commands.state != 'done'",
                (
                    command.command_id,
                    received.digest,
                    received.body,
                    command.type.value,
                    command.event_id,
                    execute_at.timestamp(),
                    command.expires_at.timestamp(),
                    now,
                    now,
                    _trace_id(command),
                ),
            )

    def begin(self, received: ReceivedCommand) -> int:
        """Mark the command "executing" (durably) before any side effect; returns the attempt number."""
        now = self._now()
        command = received.command
        with self._lock, writing(self._path):
            self._db.execute(
                "INSERT INTO commands (command_id, digest, state, body, type, event_id, execute_at, expires_at, "
                "received_at, updated_at, attempts, trace_id) VALUES (?, ?, 'executing', ?, ?, ?, NULL, ?, ?, ?, 1, ?) "
                "ON CONFLICT (command_id) DO UPDATE SET state = 'executing', execute_at = NULL, "
                "attempts = commands.attempts + 1, updated_at = excluded.updated_at",
                (
                    command.command_id,
                    received.digest,
                    received.body,
                    command.type.value,
                    command.event_id,
                    command.expires_at.timestamp(),
                    now,
                    now,
                    _trace_id(command),
                ),
            )
            (attempts,) = self._db.execute(
                "SELECT attempts FROM commands WHERE command_id = ?", (command.command_id,)
            ).fetchone()
        return int(attempts)

    def finish(self, received: ReceivedCommand, result: CommandResult) -> None:
        """Store the final result (also for a command rejected before it ever executed)."""
        now = self._now()
        command = received.command
        with self._lock, writing(self._path):
            self._db.execute(
                "INSERT INTO commands (command_id, digest, state, body, type, event_id, execute_at, expires_at, "
                "received_at, updated_at, accepted, reason, result_target, result_event_id, trace_id) "
                "VALUES (?, ?, 'done', ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (command_id) DO UPDATE SET state = 'done', execute_at = NULL, reported = 0, "
                "updated_at = excluded.updated_at, accepted = excluded.accepted, reason = excluded.reason, "
                "result_target = excluded.result_target, result_event_id = excluded.result_event_id",
                (
                    command.command_id,
                    received.digest,
                    received.body,
                    command.type.value,
                    command.event_id,
                    command.expires_at.timestamp(),
                    now,
                    now,
                    int(result.accepted),
                    result.reason,
                    result.target,
                    result.event_id,
                    _trace_id(command),
                ),
            )

    def unreported(self) -> list[CommandResult]:
        """Final results not yet handed to the outbox, e.g. because the agent stopped in between.

        A held command's bus message is long settled, so this is the only way its result is
        published after such a stop. Result ids are deterministic: publishing twice is harmless.
        """
        with self._lock:
            rows = self._db.execute(_SELECT + " WHERE state = 'done' AND reported = 0 ORDER BY updated_at").fetchall()
        return [entry.result for entry in map(_entry, rows) if entry.result is not None]

    def mark_reported(self, command_ids: Sequence[str]) -> None:
        with self._lock, writing(self._path):
            self._db.executemany("UPDATE commands SET reported = 1 WHERE command_id = ?", [(i,) for i in command_ids])

    def approved_event_ids(self) -> frozenset[str]:
        """Lowercased EventIds this agent approved, or may have (an approval interrupted mid-POST).
        An approved event that goes away ran, whatever its NotBefore said."""
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT event_id FROM commands WHERE type = 'approve' "
                "AND (state = 'executing' OR (state = 'done' AND accepted = 1))"
            ).fetchall()
        return frozenset(event_id.lower() for (event_id,) in rows)

    def requeue_interrupted(self) -> int:
        """Turn entries left "executing" by a previous process into held commands due now.

        Their bus messages may already be settled (a held command's always is), so nothing else
        would bring them back; execution re-validates against a fresh document before acting.
        """
        now = self._now()
        with self._lock, writing(self._path):
            cursor = self._db.execute(
                "UPDATE commands SET state = 'held', execute_at = ?, updated_at = ? WHERE state = 'executing'",
                (now, now),
            )
        return cursor.rowcount

    def prune(self) -> int:
        """Delete finished entries older than the retention whose command has expired, and interrupted
        ones that expired more than the retention ago. Held entries stay until they run."""
        now = self._now()
        cutoff = now - self._retention.total_seconds()
        with self._lock, writing(self._path):
            cursor = self._db.execute(
                "DELETE FROM commands WHERE (state = 'done' AND updated_at < ? AND expires_at <= ?) "
                "OR (state = 'executing' AND expires_at < ?)",
                (cutoff, now, cutoff),
            )
        if cursor.rowcount:
            LOGGER.info("pruned %d finished command(s) from the ledger", cursor.rowcount)
        return cursor.rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _now(self) -> float:
        return self._clock.now().timestamp()


def _entry(row: tuple[Any, ...]) -> LedgerEntry:
    command_id, digest, state, body, execute_at, expires_at, attempts, accepted, reason, target, event_id, trace = row
    result = None
    if accepted is not None:
        result = CommandResult(
            command_id=str(command_id),
            accepted=bool(accepted),
            event_id=str(event_id),
            target=str(target),
            reason=str(reason or ""),
            trace_id=str(trace or ""),
        )
    return LedgerEntry(
        command_id=str(command_id),
        digest=str(digest),
        state=EntryState(state),
        body=bytes(body),
        execute_at=None if execute_at is None else _from_epoch(execute_at),
        expires_at=_from_epoch(expires_at),
        attempts=int(attempts),
        result=result,
        trace_id=None if trace is None else str(trace),
    )


def _trace_id(command: Command) -> str | None:
    return command.trace.trace_id if command.trace is not None else None


def _from_epoch(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=timezone.utc)
