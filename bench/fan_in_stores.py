"""Fan-in on the cloud stores: a fleet's reports of one Azure event through the core on Azurite
(Table Storage) and on Google's Firestore emulator.

The event is the synthetic fan-in's (bench/fan_in.py): one platform Reboot of the first `resources`
of `reporters` VMs, seen by all of them, each report built as the agent builds it. Every reporter
sends the event's three steps — Scheduled, Started (incarnation 3), Completed (incarnation 4) — as
`--forward all` does; a tenth of each step's reports is delivered twice (the bus's at-least-once),
each step's deliveries shuffled, and a step delivered once the one before was processed (the event
starts once it is approved, and completes after the reboot). `WORKERS` threads,
each with its own store client like that many function instances, take from the queue and call
`process`; a delivery that meets a busy claim goes back to the queue `REDELIVERY_DELAY` later. The
proofs are not checked (a `ReporterName` verifier takes each reporter as proven); the load balancer
and command channel are in-memory fakes, so only the core and the store are measured.

- drain latency: per VM in Resources, from the first delivery of its own `scheduled` report (a
  worker took it from the queue) to the moment the pool had it removed; p50 and p99 over the VMs.
- solo: one own `scheduled` report of a fresh event processed alone on the same store, before
  the fan-in (median of `SOLO_SAMPLES`): what one report costs without contention.
- round trips and writes per message: the store's requests counted where they leave the client
  (bench/store_counting.py), over every delivery of the run.

Then the same with only the reports of VMs in Resources (what `--forward own`, the agents'
default, sends), and what that saves.
"""

from __future__ import annotations

import gc
import queue
import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bench.context import BenchContext
from bench.fan_in import POLICY, REDELIVERED_SHARE, REDELIVERY_DELAY, SEED, WORKERS, reporter_envelopes
from bench.functions_events import completion, envelope_body, new_event_id, reboot_entry, reported_event
from bench.functions_fakes import MemoryPool, MemorySender, RecordingBalancer
from bench.functions_worlds import warnings_to
from bench.peers import PeerUnavailableError, environment, start_azurite_tables, start_firestore_emulator
from bench.results import Figure, at_most, exactly
from bench.store_counting import CountingAudit, CountingStore, RoundTrips, counting_firestore, table_hook
from functions.core.ports import AuditLog, StateStore
from functions.core.process import Deps, process
from wire.commands import CommandType
from wire.envelope import decode
from wire.errors import RetryableError
from wire.identity import ReporterName
from wire.model import EventStatus, MaintenanceEvent

SOLO_SAMPLES = 5
# The drain latency target: p99 at most WORKERS times one report's solo time on the same store.
# The emulators serve few requests at once (Azurite runs on one Node.js thread), so WORKERS busy
# instances share them: each round trip of a report may wait for one of every other instance's,
# which makes WORKERS x solo its fair share of a saturated emulator. A report that takes longer
# waits for more than that: for other reports' work (a queue, a hot record's conflicts). Queued
# behind the fleet's reports it would take about the whole run's settle time.
LATENCY_FACTOR = float(WORKERS)

# A store for one worker: (state store, audit log), each reporting its requests to the counter.
Opener = Callable[[RoundTrips], tuple[StateStore, AuditLog]]


@dataclass(frozen=True)
class Fleet:
    steps: list[list[bytes]]  # Scheduled, Started, Completed: each reporter's envelope of the step
    resources: list[str]
    reporters: int


def fleet(reporters: int, resources: int) -> Fleet:
    scheduled, vms = reporter_envelopes(reporters, resources)
    seen = datetime.now(timezone.utc)
    events = [_event(body) for body in scheduled]
    started = [envelope_body(event.with_status(EventStatus.STARTED, sequence="3"), seen) for event in events]
    completed = [envelope_body(completion(event, incarnation=4), seen) for event in events]
    return Fleet([scheduled, started, completed], vms, reporters)


def own_only(run: Fleet) -> Fleet:
    """What `--forward own` sends of the fleet: the reports of VMs in Resources."""
    steps = [[body for body in step if _event(body).reporter in run.resources] for step in run.steps]
    return Fleet(steps, run.resources, run.reporters)


def _event(body: bytes) -> MaintenanceEvent:
    event = decode(body).data
    assert isinstance(event, MaintenanceEvent)
    return event


def _kind(event: MaintenanceEvent) -> str:
    mine = "own" if event.reporter in event.resources else "not-self"
    return f"{event.status.value} {mine}"


@dataclass
class Deliveries:
    outcomes: Counter[str] = field(default_factory=Counter)
    busy: int = 0
    errors: list[str] = field(default_factory=list)
    first_seen: dict[str, float] = field(default_factory=dict)  # VM → first delivery of its own scheduled
    not_self: set[str] = field(default_factory=set)
    started: float = 0.0
    last_ack: float = 0.0

    @property
    def invocations(self) -> int:
        return sum(self.outcomes.values()) + self.busy + len(self.errors)


@dataclass(frozen=True)
class FanInRun:
    messages: int
    record: Deliveries
    counter: RoundTrips
    approvals: list[str]
    drains: Counter[str]
    restores: Counter[str]
    latencies: list[float]  # own scheduled delivery → drain, per VM in Resources that was drained

    @property
    def settle(self) -> float:
        return self.record.last_ack - self.record.started

    def percentile(self, share: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def deliveries(run: Fleet) -> list[list[bytes]]:
    """Each step's reports, a tenth of them twice, shuffled within the step."""
    rng = random.Random(SEED)
    steps = []
    for step in run.steps:
        batch = step + step[::REDELIVERED_SHARE]
        rng.shuffle(batch)
        steps.append(batch)
    return steps


class Instances:
    """`WORKERS` function instances, each with its own store client, taking deliveries from a queue."""

    def __init__(self, run: Fleet, opener: Opener) -> None:
        self.counter = RoundTrips()
        self.pool, self.sender = RecordingBalancer(MemoryPool()), MemorySender()
        self.record = Deliveries()
        self._events: dict[bytes, MaintenanceEvent] = {}
        self._inbox: queue.Queue[bytes] = queue.Queue()
        self._lock = threading.Lock()
        self._deps = [
            Deps(
                store=CountingStore(store, self.counter),
                balancer=self.pool,
                sender=self.sender,
                audit=CountingAudit(audit, self.counter),
                policy=POLICY,
                verifier=ReporterName(),
            )
            for store, audit in (opener(self.counter) for _ in range(WORKERS))
        ]

    def deliver(self, bodies: Sequence[bytes]) -> None:
        """Deliver every body and wait until each one was acknowledged."""
        for body in bodies:
            self._events.setdefault(body, _event(body))
            self._inbox.put(body)
        threads = [
            threading.Thread(target=self._work, args=(deps,), name=f"instance-{i}") for i, deps in enumerate(self._deps)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _work(self, deps: Deps) -> None:
        record = self.record
        while True:
            try:
                body = self._inbox.get_nowait()
            except queue.Empty:
                return
            event = self._events[body]
            if event.status is EventStatus.SCHEDULED and event.reporter in event.resources:
                with self._lock:
                    record.first_seen.setdefault(event.reporter, time.time())
            try:
                with self.counter.envelope(_kind(event)):
                    outcome = process(body, deps, datetime.now(timezone.utc))
            except RetryableError:
                # The bus gives it back a little later (a busy claim: another instance holds it).
                with self._lock:
                    record.busy += 1
                time.sleep(REDELIVERY_DELAY)
                self._inbox.put(body)
                continue
            except Exception as error:  # reported in the figures' notes
                with self._lock:
                    record.errors.append(f"{type(error).__name__}: {error}")
                continue
            with self._lock:
                record.outcomes[outcome.result] += 1
                if outcome.result == "not-self":
                    record.not_self.add(event.reporter)
                record.last_ack = time.time()


def deliver(run: Fleet, opener: Opener) -> FanInRun:
    """The fleet's reports, step after step: the event starts once it is approved, and completes
    after the reboot, so each step's reports come after the previous step's were processed."""
    instances = Instances(run, opener)
    steps = deliveries(run)
    # The garbage the bench's earlier sections left (their agents, hosts and stores) is collected
    # now, not by a full collection in the middle of the run: one took 1.5 s there, every instance
    # thread stopped behind it, and it was the worst drain of the run.
    gc.collect()
    instances.record.started = time.time()
    for step in steps:
        instances.deliver(step)
    removals = instances.pool.removals()
    drained_at: dict[str, float] = {}
    for call in removals:
        drained_at.setdefault(call.vm, call.at)
    first_seen = instances.record.first_seen
    return FanInRun(
        messages=sum(len(step) for step in steps),
        record=instances.record,
        counter=instances.counter,
        # A command sent again (a concurrent instance found every VM out too) is the same command.
        approvals=list({c.command_id: c.target for c in instances.sender.commands(CommandType.APPROVE)}.values()),
        drains=Counter(call.vm for call in removals),
        restores=Counter(call.vm for call in instances.pool.restorations()),
        latencies=[drained_at[vm] - first_seen[vm] for vm in run.resources if vm in drained_at and vm in first_seen],
    )


def solo_seconds(opener: Opener) -> float:
    """One own scheduled report of a fresh one-VM event, alone on the store (median of a few)."""
    store, audit = opener(RoundTrips())
    deps = Deps(
        store=store, balancer=MemoryPool(), sender=MemorySender(), audit=audit, policy=POLICY, verifier=ReporterName()
    )
    samples = []
    for index in range(SOLO_SAMPLES + 1):
        vm = f"solo-{index}"
        seen = datetime.now(timezone.utc)
        entry = reboot_entry(new_event_id(), [vm], seen, source="Platform")
        body = envelope_body(reported_event(entry, vm, incarnation=2), seen)
        start = time.perf_counter()
        process(body, deps, datetime.now(timezone.utc))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples[1:])  # the first one warms the connection


# ---- the peers


@contextmanager
def azurite(context: BenchContext, name: str) -> Iterator[Opener]:
    from azure.data.tables import TableServiceClient

    from functions.azure_app.tables import TableAuditLog, TableStateStore

    with ExitStack() as stack:
        peer, connection = start_azurite_tables(context.dir(f"fan_in-{name}-azurite"))
        stack.callback(peer.stop)
        setup = TableServiceClient.from_connection_string(connection)
        stack.callback(setup.close)
        setup.create_table("mbridgestate")
        setup.create_table("mbridgeaudit")

        def opener(counter: RoundTrips) -> tuple[StateStore, AuditLog]:
            service = TableServiceClient.from_connection_string(connection, raw_response_hook=table_hook(counter))
            stack.callback(service.close)
            state, audit = service.get_table_client("mbridgestate"), service.get_table_client("mbridgeaudit")
            return TableStateStore(state), TableAuditLog(audit)

        yield opener


@contextmanager
def firestore_emulator(context: BenchContext, name: str) -> Iterator[Opener]:
    with ExitStack() as stack:
        peer = start_firestore_emulator(context.dir(f"fan_in-{name}-firestore"))
        stack.callback(peer.stop)
        stack.enter_context(environment("FIRESTORE_EMULATOR_HOST", peer.host))
        from google.cloud import firestore

        from functions.gcp_app.firestore_audit import FirestoreAuditLog
        from functions.gcp_app.firestore_store import FirestoreStateStore

        def opener(counter: RoundTrips) -> tuple[StateStore, AuditLog]:
            client = counting_firestore(firestore.Client(project=f"mbridge-fan-in-{name}"), counter)
            stack.callback(client.close)
            return FirestoreStateStore(client), FirestoreAuditLog(client)

        yield opener


# ---- figures


def _describe(run: FanInRun) -> str:
    record = run.record
    text = (
        f"{run.messages} deliveries from {WORKERS} instances, {record.invocations} invocations, outcomes "
        f"{dict(sorted(record.outcomes.items()))}, {record.busy} busy-claim redeliveries, settled in {run.settle:.2f} s"
    )
    if record.errors:
        text += f"; {len(record.errors)} deliveries FAILED, e.g. {record.errors[0]}"
    return text


def run_figures(name: str, run: FanInRun, resources: Sequence[str], solo: float, setup: str) -> list[Figure]:
    each = len(resources)
    one = len(run.approvals) == 1 and run.approvals[0] in resources
    approved = "one, to a VM in Resources, once all were out" if one else "NOT one, to a VM in Resources"
    drained_once = sorted(run.drains) == sorted(resources) and set(run.drains.values()) == {1}
    restored_once = sorted(run.restores) == sorted(resources) and set(run.restores.values()) == {1}
    trips, writes = run.counter.per_envelope()
    kinds = "; ".join(
        f"{kind}: {run.counter.per_envelope(kind)[0]:.1f} round trips, {run.counter.per_envelope(kind)[1]:.1f} writes"
        for kind in sorted(run.counter.envelopes)
    )
    limit = LATENCY_FACTOR * solo
    once = "each VM in Resources once" if drained_once else "NOT each VM once"
    put_back = "each VM once" if restored_once else "NOT each VM once"
    samples = len(run.latencies)
    latency = (
        f"first delivery of a VM's own scheduled report → the pool had it removed, over {len(run.latencies)} of the "
        f"{each} VMs in Resources; target: at most {LATENCY_FACTOR:g} x one report's solo time on this store "
        f"({solo * 1e3:.1f} ms, measured in this run: {limit * 1e3:.0f} ms), the fair share of {WORKERS} instances "
        "on one emulator (see bench/fan_in_stores.py)"
    )
    return [
        Figure(f"{name}.drains", float(sum(run.drains.values())), "count", exactly(each),
               f"VMs taken out of the pool ({once}); {setup}", 1),
        Figure(f"{name}.approvals", float(len(run.approvals)), "count", exactly(1),
               f"distinct approve commands sent ({approved}); {setup}", 1),
        Figure(f"{name}.restores", float(sum(run.restores.values())), "count", exactly(each),
               f"VMs put back by their own completion ({put_back}); {setup}", 1),
        Figure(f"{name}.drain_p50", run.percentile(0.5), "s", None, f"{latency}; {setup}", samples),
        Figure(f"{name}.drain_p99", run.percentile(0.99), "s", at_most(limit), f"{latency}; {setup}", samples),
        Figure(f"{name}.solo", solo, "s", None,
               f"one own scheduled report of a fresh one-VM event processed alone on the same store before the fan-in "
               f"(median of {SOLO_SAMPLES})", SOLO_SAMPLES),
        Figure(f"{name}.invocations", float(run.record.invocations), "count", None,
               f"calls of process, duplicates and busy-claim redeliveries included; {setup}", 1),
        Figure(f"{name}.round_trips", trips, "round trips/message", None,
               f"store requests per invocation (bench/store_counting.py), by kind of report: {kinds}; {setup}",
               run.record.invocations),
        Figure(f"{name}.writes", writes, "writes/message", None,
               f"store writes per invocation, by kind of report: {kinds}; {setup}", run.record.invocations),
        Figure(f"{name}.settle", run.settle, "s", None, f"first delivery → last delivery acknowledged; {setup}", 1),
    ]  # fmt: skip


def store_figures(context: BenchContext, store: str, peer: Callable[[BenchContext, str], Any]) -> list[Figure]:
    reporters, resources = (100, 10) if context.quick else (1000, 100)
    name = f"fan_in.{store}.fleet{reporters}"
    every = fleet(reporters, resources)
    own = own_only(every)
    try:
        with warnings_to(context.dir(f"fan_in-{store}") / "warnings.log"), peer(context, "all") as opener:
            solo = solo_seconds(opener)
            all_run = deliver(every, opener)
        with warnings_to(context.dir(f"fan_in-{store}") / "warnings-own.log"), peer(context, "own") as opener:
            own_solo = solo_seconds(opener)
            own_run = deliver(own, opener)
    except PeerUnavailableError as error:
        return [Figure(f"{name}.drain_p99", None, "s", note=str(error)),
                Figure(f"{name}.round_trips", None, "round trips/message", note=str(error))]  # fmt: skip
    event = (
        f"one platform Reboot of {resources} VMs seen by {reporters}, each reporter's Scheduled, Started and "
        f"Completed; proofs not checked (ReporterName)"
    )
    all_setup = f"{event}; --forward all: {_describe(all_run)}"
    own_setup = f"{event}; --forward own (the {resources} own reports of each step): {_describe(own_run)}"
    saved_writes = sum(all_run.counter.writes.values()) - sum(own_run.counter.writes.values())
    return [
        *run_figures(name, all_run, every.resources, solo, all_setup),
        Figure(f"{name}.not_self", float(len(all_run.record.not_self)), "count", exactly(reporters - resources),
               f"reporters whose reports were refused as not-self; {all_setup}", 1),
        *run_figures(f"{name}.forward_own", own_run, every.resources, own_solo, own_setup),
        Figure(f"{name}.writes_saved", float(saved_writes), "count", None,
               f"store writes --forward own saves on this event: {sum(all_run.counter.writes.values())} with all, "
               f"{sum(own_run.counter.writes.values())} with own; invocations {all_run.record.invocations} → "
               f"{own_run.record.invocations}; settle {all_run.settle:.2f} s → {own_run.settle:.2f} s", 1),
    ]  # fmt: skip


def run(context: BenchContext) -> list[Figure]:
    return [*store_figures(context, "azurite", azurite), *store_figures(context, "firestore", firestore_emulator)]
