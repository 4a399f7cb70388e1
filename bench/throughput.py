"""Function core throughput: envelopes per second through `functions.core.process.process`
with each real store — SQLite (a file in the work directory, WAL, synchronous=NORMAL, as the local
app runs it),
Azure Table Storage on Azurite, Firestore on Google's emulator.

The workload is what a fleet sends: distinct user-initiated Reboots, each for its own VM, built
as an agent builds them (bench/functions_events.py). Each `scheduled` envelope goes through
claim → decide (rule 4) → drain → approve → complete; its `completed` envelope follows
`OPEN_EVENTS` events later (restore, budget slot released), so about that many events are open at
any moment, as in a fleet where events come and go (with no completions, every store's budget
record of the pool would only grow). Envelopes are handed to `process` one at a time from one
thread, so the figure is the core's own cost per envelope with that store. The load balancer and
the command channel are in-memory fakes (bench/functions_fakes.py): only the core and the store
are measured. Envelopes are built before the clock starts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from bench.context import BenchContext
from bench.functions_events import completion, envelope_body, new_event_id, reboot_entry, reported_event
from bench.functions_fakes import MemoryPool, MemorySender
from bench.peers import PeerUnavailableError, environment, start_azurite_tables, start_firestore_emulator
from bench.results import Figure, at_least
from functions.core.policy import Policy
from functions.core.ports import AuditLog, StateStore
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from wire.commands import CommandType
from wire.identity import ReporterName

SQLITE_TARGET = 2000.0  # events/s
OPEN_EVENTS = 50  # events between an event's scheduled envelope and its completion
FIRESTORE_PROJECT = "mbridge-bench"


def workload(prefix: str) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """Rounds of `OPEN_EVENTS` new events: (their scheduled envelopes, their completed envelopes)."""
    serial = 0
    while True:
        scheduled, completed = [], []
        for _ in range(OPEN_EVENTS):
            vm = f"{prefix}-{serial:07d}"
            serial += 1
            seen = datetime.now(timezone.utc)
            event = reported_event(reboot_entry(new_event_id(), [vm], seen, source="User"), vm, incarnation=2)
            scheduled.append(envelope_body(event, seen))
            completed.append(envelope_body(completion(event, incarnation=4), seen))
        yield scheduled, completed


@dataclass
class Measured:
    envelopes: int
    seconds: float
    scheduled: int
    completed: int
    problems: list[str]

    @property
    def rate(self) -> float:
        return self.envelopes / self.seconds


def measure(store: StateStore, audit: AuditLog, seconds: float, prefix: str) -> Measured:
    """Process the workload until `seconds` of processing time have passed (events still open then
    are left open: the store is thrown away)."""
    pool, sender = MemoryPool(), MemorySender()
    deps = Deps(store=store, balancer=pool, sender=sender, audit=audit, policy=Policy(), verifier=ReporterName())
    rounds = workload(prefix)
    results: list[str] = []

    def handle(body: bytes) -> None:
        results.append(process(body, deps, datetime.now(timezone.utc)).result)

    # Before the clock: the first OPEN_EVENTS events are opened (which also warms connections and
    # tables), so every timed scheduled envelope comes with the completion of an earlier event.
    opening, pending = next(rounds)
    for body in opening:
        handle(body)
    results.clear()
    elapsed, scheduled, completed = 0.0, 0, 0
    while elapsed < seconds:
        new, ends = next(rounds)  # built outside the clock
        for body, end in zip(new, pending):
            start = time.perf_counter()
            handle(body)
            handle(end)
            elapsed += time.perf_counter() - start
            scheduled += 1
            completed += 1
            if elapsed >= seconds:
                break
        pending = ends
    problems = _problems(results, pool, sender, scheduled, completed)
    return Measured(len(results), elapsed, scheduled, completed, problems)


def _problems(results: list[str], pool: MemoryPool, sender: MemorySender, scheduled: int, completed: int) -> list[str]:
    """What the run did that it should not have: every event drained and approved once, every
    completion restored once (the events opened before the clock included)."""
    problems = []
    if any(result != "processed" for result in results):
        problems.append(f"outcomes {sorted(set(results))}")
    approvals = len(sender.commands(CommandType.APPROVE))
    drains, restores = sum(pool.removed.values()), sum(pool.restored.values())
    expected = (scheduled + OPEN_EVENTS, scheduled + OPEN_EVENTS, completed)
    if (drains, approvals, restores) != expected:
        problems.append(
            f"{drains} drains, {approvals} approvals, {restores} restores for {scheduled} events and "
            f"{completed} completions (and {OPEN_EVENTS} events opened before the clock)"
        )
    return problems


def figure(name: str, measured: Measured, store: str, target: float | None = None) -> Figure:
    note = (
        f"{store}; {measured.envelopes} envelopes in {measured.seconds:.2f} s, one thread: "
        f"{measured.scheduled} user Reboots (claim, decide, drain, approve, complete) and "
        f"{measured.completed} completions (restore, release), ~{OPEN_EVENTS} events open at once"
    )
    if measured.problems:
        note += "; WRONG: " + "; ".join(measured.problems)
    return Figure(
        name,
        measured.rate,
        "events/s",
        at_least(target) if target is not None else None,
        note,
        measured.envelopes,
    )


class TunedSqliteStore(SqliteStore):
    """The local store with another `synchronous` setting on its connection, for the diagnostics
    only (the store runs NORMAL: in WAL mode no fsync per commit, nothing lost when the process dies,
    the last commits lost on a power cut; FULL adds an fsync of the log per commit). It can also
    count its commits, which costs a callback per statement, so never in a timed run."""

    def __init__(self, path: Path, synchronous: str, *, count: bool = False) -> None:
        super().__init__(path)
        self.commits = 0
        self._db.execute(f"PRAGMA synchronous={synchronous}")  # the bench's diagnostic reaches in on purpose
        if count:
            self._db.set_trace_callback(self._count)

    def _count(self, statement: str) -> None:
        if statement == "COMMIT":
            self.commits += 1


def transactions_per_envelope(path: Path) -> float:
    """Store transactions per envelope of the workload (a short run; its timing is not used)."""
    store = TunedSqliteStore(path, "NORMAL", count=True)
    try:
        measured = measure(store, store, 0.5, "sqlite-count")
    finally:
        store.close()
    return store.commits / (measured.envelopes + OPEN_EVENTS)


def sqlite_figures(context: BenchContext, seconds: float) -> list[Figure]:
    directory = context.dir("throughput")
    store = SqliteStore(directory / "functions.db")
    try:
        measured = measure(store, store, seconds, "sqlite")
    finally:
        store.close()
    durable = TunedSqliteStore(directory / "functions-sync-full.db", "FULL")
    try:
        diagnostic = measure(durable, durable, seconds, "sqlite-full")
    finally:
        durable.close()
    main = figure(
        "throughput.sqlite",
        measured,
        "file-backed SQLite functions.db in the work dir (WAL, synchronous=NORMAL, as the local app runs it)",
        SQLITE_TARGET,
    )
    if main.met is False:
        transactions = transactions_per_envelope(directory / "functions-count.db")
        why = (
            f"Missed: each envelope is ~{transactions:.1f} store transactions; the core and those transactions "
            f"take {1e6 / measured.rate:.0f} µs per envelope here"
        )
        main = replace(main, note=f"{main.note}. {why}")
    extra = figure(
        "throughput.sqlite.sync_full",
        diagnostic,
        "diagnostic: the same store with synchronous=FULL (an fsync of the WAL per commit; survives a power cut)",
    )
    return [main, extra]


def azurite_figure(context: BenchContext, seconds: float) -> Figure:
    from azure.data.tables import TableServiceClient

    from functions.azure_app.tables import TableAuditLog, TableStateStore

    with ExitStack() as stack:
        try:
            peer, connection = start_azurite_tables(context.dir("throughput-azurite"))
        except PeerUnavailableError as exc:
            return Figure("throughput.azurite", None, "events/s", note=str(exc))
        stack.callback(peer.stop)
        service = TableServiceClient.from_connection_string(connection)
        stack.callback(service.close)
        state = service.create_table_if_not_exists("mbridgestate")
        audit = service.create_table_if_not_exists("mbridgeaudit")
        measured = measure(TableStateStore(state), TableAuditLog(audit), seconds, "azurite")
    return figure("throughput.azurite", measured, "Table Storage on Azurite 3.35 (TableStateStore, TableAuditLog)")


def firestore_figure(context: BenchContext, seconds: float) -> Figure:
    with ExitStack() as stack:
        try:
            peer = start_firestore_emulator(context.dir("throughput-firestore"))
        except PeerUnavailableError as exc:
            return Figure("throughput.firestore", None, "events/s", note=str(exc))
        stack.callback(peer.stop)
        stack.enter_context(environment("FIRESTORE_EMULATOR_HOST", peer.host))
        from google.cloud import firestore

        from functions.gcp_app.firestore_audit import FirestoreAuditLog
        from functions.gcp_app.firestore_store import FirestoreStateStore

        client = firestore.Client(project=FIRESTORE_PROJECT)
        stack.callback(client.close)
        measured = measure(FirestoreStateStore(client), FirestoreAuditLog(client), seconds, "firestore")
    return figure("throughput.firestore", measured, "Firestore emulator (FirestoreStateStore, FirestoreAuditLog)")


def run(context: BenchContext) -> list[Figure]:
    seconds = 2.0 if context.quick else 20.0
    return [*sqlite_figures(context, seconds), azurite_figure(context, seconds), firestore_figure(context, seconds)]
