"""`local`: the embedded bus, one SQLite file shared by agents, the local function host,
the demo and `mbridge approve`.

It behaves like the cloud buses where it matters: events are deduplicated on their
message id (Service Bus duplicate detection on MessageId: see `OutboundMessage.bus_id`),
commands are addressed to one VM and stay until settled (a session queue), and readers keep
their own position.

SQLite cannot notify another process, so a waiting command receiver does not poll the file: it
listens on a loopback UDP port of its own, written in the bus (`doorbells`), and whoever queues
a command for its VM sends that port an empty datagram once the command is committed. The
receiver then reads the file. A datagram carries nothing but "look now": one from anyone else
costs one query, and one lost costs at most the receiver's wait (the agent waits a minute).
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from wire.transports.base import (
    CommandReceiver,
    InboundCommand,
    OutboundMessage,
    TransportConfigError,
    TransportUnavailableError,
)

EVENTS_COLUMNS = """(
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id   TEXT NOT NULL UNIQUE,
    envelope_id  TEXT NOT NULL,
    key          TEXT NOT NULL,
    body         BLOB NOT NULL,
    attributes   TEXT NOT NULL,
    published_at REAL NOT NULL
)"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS events {EVENTS_COLUMNS};
CREATE TABLE IF NOT EXISTS commands (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    command_id   TEXT NOT NULL UNIQUE,
    target       TEXT NOT NULL,
    body         BLOB NOT NULL,
    attributes   TEXT NOT NULL,
    sent_at      REAL NOT NULL,
    settled_at   REAL
);
CREATE INDEX IF NOT EXISTS commands_open ON commands (target, settled_at, seq);
CREATE TABLE IF NOT EXISTS positions (
    reader   TEXT PRIMARY KEY,
    position INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS doorbells (
    target TEXT NOT NULL,
    port   INTEGER NOT NULL,
    PRIMARY KEY (target, port)
) WITHOUT ROWID;
"""

# A bus file of an earlier version deduplicated events on their envelope id: its events move to
# the current table, their envelope id as their message id, their sequence numbers (the readers'
# positions) kept.
MIGRATE_EVENTS = (
    "ALTER TABLE events RENAME TO events_by_envelope",
    "CREATE TABLE events " + EVENTS_COLUMNS,
    "INSERT INTO events (seq, message_id, envelope_id, key, body, attributes, published_at) "
    "SELECT seq, envelope_id, envelope_id, key, body, attributes, published_at FROM events_by_envelope",
    "DROP TABLE events_by_envelope",
)

# How often a waiting reader of events or results looks again (the operator's and the host's side;
# the agent's command receiver waits on its doorbell instead).
POLL_SECONDS = 0.05
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class BusEvent:
    seq: int
    envelope_id: str
    key: str
    body: bytes
    attributes: Mapping[str, str]
    published_at: float  # Unix seconds, when the bus took it


class LocalBus:
    """One SQLite bus file. Every method opens its own short transaction; safe across threads
    and processes (WAL, busy timeout)."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._ringer: socket.socket | None = None  # made when the first command is sent
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), timeout=30, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._migrate()
            self._db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise TransportConfigError(f"cannot open the local bus at {path}: {exc}; check --bus-path") from exc

    def _migrate(self) -> None:
        if not self._events_by_envelope():
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if self._events_by_envelope():  # another process may have migrated meanwhile
                for statement in MIGRATE_EVENTS:
                    self._db.execute(statement)
            self._db.execute("COMMIT")
        except sqlite3.Error:
            self._db.execute("ROLLBACK")
            raise

    def _events_by_envelope(self) -> bool:
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(events)")}
        return bool(columns) and "message_id" not in columns

    # ---- events

    def publish_event(self, message: OutboundMessage) -> bool:
        """Append an event; False when its message id was already there (duplicate detection)."""
        cursor = self._execute(
            "INSERT OR IGNORE INTO events (message_id, envelope_id, key, body, attributes, published_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (message.bus_id, message.envelope_id, message.key, message.body, _attributes(message), self._clock()),
        )
        return cursor.rowcount == 1

    def read_events(self, after: int, limit: int = 100) -> list[BusEvent]:
        rows = self._execute(
            "SELECT seq, envelope_id, key, body, attributes, published_at FROM events "
            "WHERE seq > ? ORDER BY seq LIMIT ?",
            (after, limit),
        ).fetchall()
        return [BusEvent(r[0], r[1], r[2], bytes(r[3]), json.loads(r[4]), r[5]) for r in rows]

    def last_event_seq(self) -> int:
        (value,) = self._execute("SELECT COALESCE(MAX(seq), 0) FROM events", ()).fetchone()
        return int(value)

    def position(self, reader: str) -> int:
        row = self._execute("SELECT position FROM positions WHERE reader = ?", (reader,)).fetchone()
        return 0 if row is None else int(row[0])

    def save_position(self, reader: str, position: int) -> None:
        self._execute(
            "INSERT INTO positions (reader, position) VALUES (?, ?) "
            "ON CONFLICT(reader) DO UPDATE SET position = excluded.position",
            (reader, position),
        )

    # ---- commands

    def send_command(self, message: OutboundMessage) -> bool:
        """Queue a command for `message.key`; False when that command id was already queued."""
        cursor = self._execute(
            "INSERT OR IGNORE INTO commands (command_id, target, body, attributes, sent_at) VALUES (?, ?, ?, ?, ?)",
            (message.envelope_id, message.key, message.body, _attributes(message), self._clock()),
        )
        queued = cursor.rowcount == 1
        if queued:
            self._ring(message.key)
        return queued

    def hang_doorbell(self, target: str, port: int) -> None:
        """Have senders of commands for `target` ring `port` on the loopback address."""
        self._execute("INSERT OR IGNORE INTO doorbells (target, port) VALUES (?, ?)", (target, port))

    def take_down_doorbell(self, target: str, port: int) -> None:
        self._execute("DELETE FROM doorbells WHERE target = ? AND port = ?", (target, port))

    def _ring(self, target: str) -> None:
        """Wake the receivers of `target`, after the command is committed. Best effort: a receiver
        that misses the ring finds the command when its wait ends."""
        ports = [row[0] for row in self._execute("SELECT port FROM doorbells WHERE target = ?", (target,))]
        with self._lock:
            if self._ringer is None:
                self._ringer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self._ringer.setblocking(False)
            for port in ports:
                # OSError: a receiver gone since (its port closed), or a full buffer (a ring is already waiting)
                with contextlib.suppress(OSError):
                    self._ringer.sendto(b"", (LOOPBACK, port))

    def open_commands(self, target: str, limit: int = 10) -> list[tuple[int, bytes, Mapping[str, str]]]:
        rows = self._execute(
            "SELECT seq, body, attributes FROM commands WHERE target = ? AND settled_at IS NULL ORDER BY seq LIMIT ?",
            (target, limit),
        ).fetchall()
        return [(r[0], bytes(r[1]), json.loads(r[2])) for r in rows]

    def settle_command(self, seq: int) -> None:
        self._execute("UPDATE commands SET settled_at = ? WHERE seq = ?", (self._clock(), seq))

    def close(self) -> None:
        with self._lock:
            self._db.close()
            if self._ringer is not None:
                self._ringer.close()

    def _execute(self, sql: str, params: Sequence[object]) -> sqlite3.Cursor:
        try:
            with self._lock:
                return self._db.execute(sql, params)
        except sqlite3.Error as exc:
            raise TransportUnavailableError(f"local bus {self.path}: {exc}") from exc


def _drain(doorbell: socket.socket) -> None:
    """Empty the doorbell's queue of rings; they all mean the same: look now."""
    while True:
        try:
            doorbell.recv(16)
        except OSError:  # BlockingIOError: nothing more waiting
            return


def _attributes(message: OutboundMessage) -> str:
    return json.dumps(dict(message.attributes), sort_keys=True)


class LocalCommandReceiver:
    def __init__(self, bus: LocalBus, vm_name: str) -> None:
        self._bus = bus
        self._vm_name = vm_name
        # A command handed out but not yet settled is not handed out again by this receiver.
        self._in_flight: set[int] = set()
        self._lock = threading.Lock()
        self._doorbell: socket.socket | None = None  # hung at the first wait
        self._interrupted = False  # for good: the agent is stopping

    def receive_commands(self, max_wait: float) -> Sequence[InboundCommand]:
        deadline = time.monotonic() + max_wait
        doorbell = self._hang_doorbell()
        while True:
            _drain(doorbell)  # before the query: a ring after it is for a command the query may miss
            with self._lock:
                fresh = [row for row in self._bus.open_commands(self._vm_name) if row[0] not in self._in_flight]
                self._in_flight.update(row[0] for row in fresh)
            left = deadline - time.monotonic()
            if fresh or left <= 0 or self._interrupted:
                return [
                    InboundCommand(
                        body=body, attributes=attributes, settle=self._settler(seq), abandon=self._abandoner(seq)
                    )
                    for seq, body, attributes in fresh
                ]
            select.select([doorbell], [], [], left)

    def interrupt(self) -> None:
        """Make a waiting `receive_commands` return now, and every later one at once (stopping)."""
        with self._lock:
            self._interrupted = True
            doorbell = self._doorbell
        if doorbell is not None:
            with contextlib.suppress(OSError):
                doorbell.sendto(b"", doorbell.getsockname())

    def close(self) -> None:
        with self._lock:
            doorbell, self._doorbell = self._doorbell, None
        if doorbell is not None:
            # The bus may be gone already; a ring to a closed port is dropped anyway.
            with contextlib.suppress(TransportUnavailableError):
                self._bus.take_down_doorbell(self._vm_name, doorbell.getsockname()[1])
            doorbell.close()

    def _hang_doorbell(self) -> socket.socket:
        with self._lock:
            if self._doorbell is not None:
                return self._doorbell
            doorbell = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                doorbell.bind((LOOPBACK, 0))
                doorbell.setblocking(False)
                self._bus.hang_doorbell(self._vm_name, doorbell.getsockname()[1])
            except (OSError, TransportUnavailableError) as exc:
                doorbell.close()
                raise TransportUnavailableError(f"cannot listen for commands on the loopback address: {exc}") from exc
            self._doorbell = doorbell
            return doorbell

    def _abandoner(self, seq: int) -> Callable[[], None]:
        def abandon() -> None:
            with self._lock:
                self._in_flight.discard(seq)

        return abandon

    def _settler(self, seq: int) -> Callable[[], None]:
        def settle() -> None:
            self._bus.settle_command(seq)
            with self._lock:
                self._in_flight.discard(seq)

        return settle


class LocalTransport:
    """The agent's side of the local bus."""

    name = "local"

    def __init__(self, bus: LocalBus, vm_name: str) -> None:
        self.bus = bus
        self._commands = LocalCommandReceiver(bus, vm_name)

    @classmethod
    def open(cls, path: Path, vm_name: str) -> LocalTransport:
        return cls(LocalBus(path), vm_name)

    @property
    def commands(self) -> CommandReceiver | None:
        return self._commands

    def publish(self, message: OutboundMessage) -> None:
        self.bus.publish_event(message)

    def check(self) -> str:
        return f"local bus at {self.bus.path}: {self.bus.last_event_seq()} events so far"

    def rest(self) -> None:
        """Take this agent's doorbell down: nobody rings an agent that is not waiting."""
        self._commands.close()

    def close(self) -> None:
        self._commands.close()
        self.bus.close()


class LocalOperator:
    """`mbridge approve` on the local bus: send a command, then read results published after it."""

    def __init__(self, bus: LocalBus, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self._bus = bus
        self._sleep = sleep
        self._position = bus.last_event_seq()

    def send_command(self, message: OutboundMessage) -> None:
        self._bus.send_command(message)

    def close(self) -> None:
        self._bus.close()

    def read_results(self, max_wait: float) -> Sequence[bytes]:
        deadline = time.monotonic() + max_wait
        while True:
            events = self._bus.read_events(self._position)
            if events:
                self._position = events[-1].seq
                return [event.body for event in events]
            if time.monotonic() >= deadline:
                return []
            self._sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
