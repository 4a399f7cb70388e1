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

On Azurite and the Firestore emulator, the timed envelopes' requests to the store are counted
where they leave the client, per step of the core (bench/store_counting.py): round trips and
writes per envelope, which with the rate say what one round trip costs there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from bench.context import BenchContext
from bench.functions_events import completion, envelope_body, new_event_id, reboot_entry, reported_event
from bench.functions_fakes import MemoryPool, MemorySender
from bench.peers import PeerUnavailableError, environment, start_azurite_tables, start_firestore_emulator
from bench.results import Figure, at_least
from bench.store_counting import CountingAudit, CountingStore, RoundTrips, counting_firestore, table_hook
from functions.core.policy import Policy
from functions.core.ports import AuditLog, StateStore
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from wire.commands import CommandType
from wire.identity import ReporterName

SQLITE_TARGET = 2000.0  # events/s
OPEN_EVENTS = 50  # events between an event's scheduled envelope and its completion
FIRESTORE_PROJECT = "mbridge-bench"


def workload(
    prefix: str, clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc), open_events: int = OPEN_EVENTS
) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """Rounds of `open_events` new events: (their scheduled envelopes, their completed envelopes)."""
    serial = 0
    while True:
        scheduled, completed = [], []
        for _ in range(open_events):
            vm = f"{prefix}-{serial:07d}"
            serial += 1
            seen = clock()
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


def measure(
    store: StateStore, audit: AuditLog, seconds: float, prefix: str, counter: RoundTrips | None = None
) -> Measured:
    """Process the workload until `seconds` of processing time have passed (events still open then
    are left open: the store is thrown away). With a `counter`, the store's requests of the timed
    envelopes are counted per step (the client must report them to it: bench/store_counting.py)."""
    pool, sender = MemoryPool(), MemorySender()
    if counter is not None:
        store, audit = CountingStore(store, counter), CountingAudit(audit, counter)
    deps = Deps(store=store, balancer=pool, sender=sender, audit=audit, policy=Policy(), verifier=ReporterName())
    rounds = workload(prefix)
    results: list[str] = []

    def handle(body: bytes, kind: str) -> None:
        counting: AbstractContextManager[None] = nullcontext() if counter is None else counter.envelope(kind)
        with counting:
            results.append(process(body, deps, datetime.now(timezone.utc)).result)

    # Before the clock: the first OPEN_EVENTS events are opened (which also warms connections and
    # tables), so every timed scheduled envelope comes with the completion of an earlier event.
    opening, pending = next(rounds)
    for body in opening:
        handle(body, "scheduled")
    results.clear()
    if counter is not None:
        counter.reset()
    elapsed, scheduled, completed = 0.0, 0, 0
    while elapsed < seconds:
        new, ends = next(rounds)  # built outside the clock
        for body, end in zip(new, pending):
            start = time.perf_counter()
            handle(body, "scheduled")
            handle(end, "completed")
            elapsed += time.perf_counter() - start
            scheduled += 1
            completed += 1
            if elapsed >= seconds:
                break
        pending = ends
    problems = _problems(results, pool, sender, scheduled, completed)
    return Measured(len(results), elapsed, scheduled, completed, problems)


def count_per_message(
    store: StateStore,
    audit: AuditLog,
    counter: RoundTrips,
    clock: Callable[[], datetime],
    *,
    open_events: int = 5,
    prefix: str = "counted",
    policy: Policy | None = None,
) -> list[str]:
    """The workload of `measure` without a clock of its own: `open_events` events opened, then as many
    more each with the completion of an earlier one, the requests of the second round counted per
    envelope kind in `counter`. Returns what went wrong (see `measure`)."""
    pool, sender = MemoryPool(), MemorySender()
    deps = Deps(
        store=CountingStore(store, counter),
        balancer=pool,
        sender=sender,
        audit=CountingAudit(audit, counter),
        policy=policy or Policy(),
        verifier=ReporterName(),
        monotonic=lambda: 0.0,
    )
    rounds = workload(prefix, clock, open_events)
    opening, pending = next(rounds)
    results: list[str] = [process(body, deps, clock()).result for body in opening]
    counter.reset()
    new, _ = next(rounds)
    for body, end in zip(new, pending):
        for kind, message in (("scheduled", body), ("completed", end)):
            with counter.envelope(kind):
                results.append(process(message, deps, clock()).result)
    return _problems(results, pool, sender, open_events, open_events, opening=open_events)


def _problems(
    results: list[str],
    pool: MemoryPool,
    sender: MemorySender,
    scheduled: int,
    completed: int,
    opening: int = OPEN_EVENTS,
) -> list[str]:
    """What the run did that it should not have: every event drained and approved once, every
    completion restored once (the `opening` events opened before the clock included)."""
    problems = []
    if any(result != "processed" for result in results):
        problems.append(f"outcomes {sorted(set(results))}")
    approvals = len(sender.commands(CommandType.APPROVE))
    drains, restores = sum(pool.removed.values()), sum(pool.restored.values())
    expected = (scheduled + opening, scheduled + opening, completed)
    if (drains, approvals, restores) != expected:
        problems.append(
            f"{drains} drains, {approvals} approvals, {restores} restores for {scheduled} events and "
            f"{completed} completions (and {opening} events opened before the clock)"
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


def round_trip_figures(name: str, measured: Measured, counter: RoundTrips, requests: str) -> list[Figure]:
    """Round trips and writes per envelope of the timed run, with where they go per step."""
    trips, writes = counter.per_envelope()
    steps = (
        f"per scheduled envelope: {counter.breakdown('scheduled')}; per completed envelope: "
        f"{counter.breakdown('completed')} (w: writes)"
    )
    how = (
        f"{requests} to the store counted where they leave the client (bench/store_counting.py), over the "
        f"{measured.envelopes} timed envelopes of {name}"
    )
    per_trip = 1e3 / measured.rate / trips if trips else 0.0
    return [
        Figure(
            f"{name}.round_trips",
            trips,
            "round trips/envelope",
            None,
            f"{how}; ~{per_trip:.2f} ms per round trip at {measured.rate:.1f} envelopes/s; {steps}",
            measured.envelopes,
        ),
        Figure(f"{name}.writes", writes, "writes/envelope", None, f"{how}; {steps}", measured.envelopes),
    ]


def not_measured(name: str, reason: str) -> list[Figure]:
    return [
        Figure(name, None, "events/s", note=reason),
        Figure(f"{name}.round_trips", None, "round trips/envelope", note=reason),
        Figure(f"{name}.writes", None, "writes/envelope", note=reason),
    ]


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


def azurite_figures(context: BenchContext, seconds: float) -> list[Figure]:
    from azure.data.tables import TableServiceClient

    from functions.azure_app.tables import TableAuditLog, TableStateStore

    with ExitStack() as stack:
        try:
            peer, connection = start_azurite_tables(context.dir("throughput-azurite"))
        except PeerUnavailableError as exc:
            return not_measured("throughput.azurite", str(exc))
        stack.callback(peer.stop)
        counter = RoundTrips()
        service = TableServiceClient.from_connection_string(connection, raw_response_hook=table_hook(counter))
        stack.callback(service.close)
        state = service.create_table_if_not_exists("mbridgestate")
        audit = service.create_table_if_not_exists("mbridgeaudit")
        measured = measure(TableStateStore(state), TableAuditLog(audit), seconds, "azurite", counter)
    store = "Table Storage on Azurite 3.35 (TableStateStore, TableAuditLog)"
    return [
        figure("throughput.azurite", measured, store),
        *round_trip_figures("throughput.azurite", measured, counter, "HTTP requests"),
    ]


def firestore_figures(context: BenchContext, seconds: float) -> list[Figure]:
    with ExitStack() as stack:
        try:
            peer = start_firestore_emulator(context.dir("throughput-firestore"))
        except PeerUnavailableError as exc:
            return not_measured("throughput.firestore", str(exc))
        stack.callback(peer.stop)
        stack.enter_context(environment("FIRESTORE_EMULATOR_HOST", peer.host))
        from google.cloud import firestore

        from functions.gcp_app.firestore_audit import FirestoreAuditLog
        from functions.gcp_app.firestore_store import FirestoreStateStore

        counter = RoundTrips()
        client = counting_firestore(firestore.Client(project=FIRESTORE_PROJECT), counter)
        stack.callback(client.close)
        measured = measure(FirestoreStateStore(client), FirestoreAuditLog(client), seconds, "firestore", counter)
    store = "Firestore emulator (FirestoreStateStore, FirestoreAuditLog)"
    return [
        figure("throughput.firestore", measured, store),
        *round_trip_figures("throughput.firestore", measured, counter, "RPCs"),
    ]


def run(context: BenchContext) -> list[Figure]:
    seconds = 2.0 if context.quick else 20.0
    return [*sqlite_figures(context, seconds), *azurite_figures(context, seconds), *firestore_figures(context, seconds)]
