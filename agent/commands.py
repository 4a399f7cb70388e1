"""Commands addressed to this VM: check them, remember them, execute them at most once.

See docs/contracts.md#what-the-agent-checks. The agent must never approve what it should not, so
every command passes, in order:

1. decoding (strict; a malformed command is rejected under a derived id),
2. the target (a command for another VM is ignored, never answered: the Pub/Sub emulator does not
   apply subscription filters, so agents see each other's commands, and an answer from the wrong
   VM would put a false "rejected" on the channel),
3. the signature, when a verification key is configured,
4. replay (the ledger knows every command_id it accepted for processing),
5. expiry, and `execute_at` (the command is held in the ledger until then).

Execution records "executing" in the ledger before any side effect, and the final result (with the
content digest) before the result is returned for publishing. A redelivered command therefore gets
the stored result back with the same id, and nothing runs twice. An approval re-validates against
a fresh Scheduled Events document at execution time and POSTs once.

The ledger is one SQLite file (WAL) owned by the caller's state directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from agent.sources.azure.client import ApprovalRefusedError
from agent.sources.azure.document import AzureEventStatus, AzureScheduledEvent, ScheduledEventsDocument
from agent.sources.http import MetadataUnavailableError
from agent.state_files import open_database, writing
from agent.timing import Clock, SystemClock
from wire.commands import (
    Command,
    CommandType,
    MalformedCommandError,
    ReceivedCommand,
    decode_command,
    load_command_object,
)
from wire.errors import PermanentError, RetryableError
from wire.model import Cloud, CommandResult
from wire.timefmt import format_rfc3339

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

LOGGER = logging.getLogger("mbridge.commands")

DEFAULT_RETENTION = timedelta(hours=24)
# A held command whose execution met an unavailable IMDS is tried again this much later (its
# bus message is already settled, so no redelivery will bring it back).
RETRY_DELAY = timedelta(seconds=5)
PRUNE_INTERVAL = timedelta(hours=1)
LEDGER_SCHEMA_VERSION = 1

IGNORED_OTHER_TARGET = "other_target"
UNKNOWN_EVENT = "unknown"


class Readiness(Protocol):
    """What `drain` / `restore` flip: the agent's `/readyz`."""

    def set_drained(self, drained: bool, reason: str) -> None: ...


class Approver(Protocol):
    """The in-VM Scheduled Events API (AzureImdsClient satisfies it)."""

    def fetch_document(self) -> ScheduledEventsDocument:
        """Raises MetadataUnavailableError when IMDS gives no usable answer."""
        ...

    def post_approval(self, event_id: str) -> None:
        """Raises ApprovalRefusedError (400) or MetadataUnavailableError (transient)."""
        ...


class CommandRetryableError(RetryableError):
    """The command could not be finished now (IMDS unavailable); leave its message unsettled so
    the bus redelivers it. No final result was recorded."""


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

_SELECT = (
    "SELECT command_id, digest, state, body, execute_at, expires_at, attempts, accepted, reason, result_target, "
    "result_event_id FROM commands"
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
                "received_at, updated_at) VALUES (?, ?, 'held', ?, ?, ?, ?, ?, ?, ?) "
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
                ),
            )

    def begin(self, received: ReceivedCommand) -> int:
        """Mark the command "executing" (durably) before any side effect; returns the attempt number."""
        now = self._now()
        command = received.command
        with self._lock, writing(self._path):
            self._db.execute(
                "INSERT INTO commands (command_id, digest, state, body, type, event_id, execute_at, expires_at, "
                "received_at, updated_at, attempts) VALUES (?, ?, 'executing', ?, ?, ?, NULL, ?, ?, ?, 1) "
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
                "received_at, updated_at, accepted, reason, result_target, result_event_id) "
                "VALUES (?, ?, 'done', ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?) "
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
    command_id, digest, state, body, execute_at, expires_at, attempts, accepted, reason, target, event_id = row
    result = None
    if accepted is not None:
        result = CommandResult(
            command_id=str(command_id),
            accepted=bool(accepted),
            event_id=str(event_id),
            target=str(target),
            reason=str(reason or ""),
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
    )


def _from_epoch(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=timezone.utc)


class CommandProcessor:
    """Checks, holds and executes the commands addressed to `vm_name`.

    `handle` is called for each received message; `run_due` whenever `next_due_at` has come.
    Both return the results to publish. One instance per agent; calls are serialised.
    """

    def __init__(
        self,
        *,
        vm_name: str,
        cloud: Cloud,
        ledger: CommandLedger,
        readiness: Readiness,
        approver: Approver | None,
        verify_key: Ed25519PublicKey | None,
        dry_run: bool,
        clock: Clock,
        on_ignored: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self._vm_name = vm_name
        self._cloud = cloud
        self._ledger = ledger
        self._readiness = readiness
        self._approver = approver
        self._verify_key = verify_key
        self._dry_run = dry_run
        self._clock = clock
        self._on_ignored = on_ignored
        self._lock = threading.RLock()
        self._last_prune = clock.now()
        interrupted = ledger.requeue_interrupted()
        if interrupted:
            LOGGER.warning(
                "%d command(s) were interrupted while executing; they will be re-validated against a fresh "
                "document and executed at most once more",
                interrupted,
            )

    # ---- receipt

    def handle(self, body: bytes) -> CommandResult | None:
        """Check one received command and execute it when due.

        Returns the result to publish now, or None when the command is held for its execute_at
        (or already held) or is addressed to another VM.

        Raises:
            CommandRetryableError: IMDS was unavailable; no final result was recorded. Leave the
                message unsettled so the bus redelivers it.
        """
        with self._lock:
            try:
                received = decode_command(body)
            except MalformedCommandError as exc:
                return self._malformed(body, exc)
            command = received.command
            if command.target != self._vm_name:
                self._ignore(command.command_id, command.target)
                return None
            refusal = self._signature_refusal(received)
            if refusal is not None:
                LOGGER.warning("refused command %s: %s", command.command_id, refusal)
                return _rejected(command, refusal)
            return self._admit(received)

    def _malformed(self, body: bytes, exc: MalformedCommandError) -> CommandResult | None:
        other = _declared_target(body)
        if other is not None and other != self._vm_name:
            self._ignore("(malformed)", other)
            return None
        command_id = "malformed-" + hashlib.sha256(body).hexdigest()[:16]
        LOGGER.warning("rejected malformed command %s: %s", command_id, exc)
        return CommandResult(
            command_id=command_id,
            accepted=False,
            event_id=UNKNOWN_EVENT,
            target=self._vm_name,
            reason=f"malformed command: {exc}",
        )

    def _ignore(self, command_id: str, target: str) -> None:
        LOGGER.info("ignored command %s: it is addressed to %s, not to this VM (%s)", command_id, target, self._vm_name)
        self._on_ignored(IGNORED_OTHER_TARGET)

    def _signature_refusal(self, received: ReceivedCommand) -> str | None:
        if self._verify_key is None:
            return None
        if received.command.signature is None:
            return (
                "unsigned: this agent has a verification key and accepts signed commands only; "
                "sign the command with the matching private key"
            )
        from wire.signing import BadSignatureError, verify

        try:
            verify(received.canonical, received.command.signature, self._verify_key)
        except BadSignatureError as exc:
            return f"bad signature: {exc}"
        return None

    def _admit(self, received: ReceivedCommand) -> CommandResult | None:
        command = received.command
        entry = self._ledger.get(command.command_id)
        if entry is not None:
            return self._replayed(received, entry)
        now = self._clock.now()
        if now >= command.expires_at:
            return self._finish(received, _rejected(command, _expired_reason(command, now)))
        if command.execute_at is not None and command.execute_at > now:
            self._ledger.hold(received, command.execute_at)
            LOGGER.info(
                "holding %s command %s for event %s until %s",
                command.type.value,
                command.command_id,
                command.event_id,
                format_rfc3339(command.execute_at),
            )
            return None
        return self._execute(received)

    def _replayed(self, received: ReceivedCommand, entry: LedgerEntry) -> CommandResult | None:
        command = received.command
        if entry.digest != received.digest:
            # Not stored: the entry under this id belongs to the command that came first.
            LOGGER.warning("rejected command %s: its id was used before by a different command", command.command_id)
            return _rejected(command, "command_id reused with different content")
        if entry.result is not None:
            LOGGER.info("command %s was seen before; answering with the stored result", command.command_id)
            return entry.result
        if entry.state is EntryState.HELD:
            return None
        # "executing" without a result: an earlier attempt failed transiently. Try again (re-validated).
        return self._execute(received)

    # ---- held commands

    def run_due(self) -> list[CommandResult]:
        """Execute the held commands whose execute_at has come; returns their results to publish.

        A transient IMDS failure puts the command back for `RETRY_DELAY` (never past its expiry,
        which then rejects it).
        """
        with self._lock:
            now = self._clock.now()
            self._maybe_prune(now)
            results = []
            for entry in self._ledger.due(now):
                received = decode_command(entry.body)
                try:
                    results.append(self._execute(received))
                except CommandRetryableError as exc:
                    retry_at = min(now + RETRY_DELAY, received.command.expires_at)
                    self._ledger.hold(received, retry_at)
                    LOGGER.warning(
                        "command %s will be tried again at %s: %s", entry.command_id, format_rfc3339(retry_at), exc
                    )
            return results

    def unreported(self) -> list[CommandResult]:
        """Results recorded in the ledger but not yet confirmed in the outbox (see CommandLedger)."""
        return self._ledger.unreported()

    def mark_reported(self, results: Sequence[CommandResult]) -> None:
        self._ledger.mark_reported([result.command_id for result in results])

    def next_due_at(self) -> datetime | None:
        return self._ledger.next_due_at()

    def approved_event_ids(self) -> frozenset[str]:
        """See CommandLedger.approved_event_ids; nothing in a dry run, which never POSTs."""
        return frozenset() if self._dry_run else self._ledger.approved_event_ids()

    def _maybe_prune(self, now: datetime) -> None:
        if now - self._last_prune >= PRUNE_INTERVAL:
            self._last_prune = now
            self._ledger.prune()

    # ---- execution

    def _execute(self, received: ReceivedCommand) -> CommandResult:
        command = received.command
        attempt = self._ledger.begin(received)
        result = self._run(command, attempt)
        LOGGER.info(
            "%s command %s for event %s: %s (%s)",
            command.type.value,
            command.command_id,
            command.event_id,
            result.result,
            result.reason,
        )
        return self._finish(received, result)

    def _finish(self, received: ReceivedCommand, result: CommandResult) -> CommandResult:
        self._ledger.finish(received, result)
        return result

    def _run(self, command: Command, attempt: int) -> CommandResult:
        now = self._clock.now()
        if now >= command.expires_at:
            return _rejected(command, _expired_reason(command, now))
        if command.type is CommandType.DRAIN:
            self._readiness.set_drained(True, f"drain command {command.command_id} (event {command.event_id})")
            return _accepted(command, "drained: /readyz now reports unready")
        if command.type is CommandType.RESTORE:
            self._readiness.set_drained(False, f"restore command {command.command_id} (event {command.event_id})")
            return _accepted(command, "restored: /readyz reports ready again")
        return self._approve(command, attempt)

    def _approve(self, command: Command, attempt: int) -> CommandResult:
        if self._cloud is Cloud.GCE:
            return _rejected(command, "GCE has no in-VM approval; the function uses instances.performMaintenance")
        if self._approver is None:
            return _rejected(
                command, "this agent has no Scheduled Events client to approve with; run it with the Azure source"
            )
        event = self._fresh_event(command, self._approver)
        if event is None:
            return _rejected(
                command,
                f"event {command.event_id} is not in the current Scheduled Events document "
                "(canceled, completed, or never shown to this VM)",
            )
        refusal = self._event_refusal(event, attempt)
        if refusal is not None:
            return _rejected(command, refusal)
        now = self._clock.now()
        if now >= command.expires_at:  # the document fetch may have taken a while
            return _rejected(command, _expired_reason(command, now))
        if self._dry_run:
            return _accepted(command, f"dry run: would have approved {event.event_id}")
        try:
            self._approver.post_approval(event.event_id)
        except ApprovalRefusedError as exc:
            return _rejected(command, str(exc))
        except MetadataUnavailableError as exc:
            raise CommandRetryableError(
                f"approve command {command.command_id}: POST to IMDS failed ({exc.kind}: {exc}); no result recorded, "
                "leave the command unsettled so it is redelivered (the retry re-validates, and Azure answers 200 "
                "for an event that is already approved)"
            ) from exc
        return _accepted(command, f"approved: StartRequests POSTed for {event.event_id}")

    def _fresh_event(self, command: Command, approver: Approver) -> AzureScheduledEvent | None:
        try:
            document = approver.fetch_document()
        except MetadataUnavailableError as exc:
            raise CommandRetryableError(
                f"approve command {command.command_id}: cannot read the Scheduled Events document "
                f"({exc.kind}: {exc}); nothing was POSTed, leave the command unsettled so it is redelivered"
            ) from exc
        return document.by_id().get(command.event_id.lower())

    def _event_refusal(self, event: AzureScheduledEvent, attempt: int) -> str | None:
        if event.status is AzureEventStatus.STARTED:
            earlier = " (an earlier attempt of this command may have approved it)" if attempt > 1 else ""
            return f"event {event.event_id} is already Started{earlier}"
        if event.status is not AzureEventStatus.SCHEDULED:
            # Strict where it matters: only an event IMDS plainly shows as Scheduled is approved.
            return f"event {event.event_id} is not Scheduled ({event.unreadable.get('EventStatus', 'status unknown')})"
        if self._vm_name not in event.resources:
            return (
                f"this VM is not in Resources of event {event.event_id} ({self._vm_name} not in "
                f"{', '.join(event.resources) or 'an empty list'}): only a VM the event concerns approves it"
            )
        return None


def _accepted(command: Command, reason: str) -> CommandResult:
    return CommandResult(
        command_id=command.command_id, accepted=True, event_id=command.event_id, target=command.target, reason=reason
    )


def _rejected(command: Command, reason: str) -> CommandResult:
    return CommandResult(
        command_id=command.command_id, accepted=False, event_id=command.event_id, target=command.target, reason=reason
    )


def _expired_reason(command: Command, now: datetime) -> str:
    return f"expired: expires_at {format_rfc3339(command.expires_at)} has passed (now {format_rfc3339(now)})"


def _declared_target(body: bytes) -> str | None:
    """The `target` a malformed command names, if it names one: a broken command for another VM is
    that VM's to reject."""
    try:
        document = load_command_object(body)
    except MalformedCommandError:
        return None
    target = document.get("target")
    return target if isinstance(target, str) and target else None
