"""Drill 4: function invocations killed at random points, and every envelope delivered three times.

The real `process` runs against the real stores (SQLite; once Firestore's emulator) with effects
counted where they happen: a VM leaving or joining its pool (not calls: a retried removal of a VM
already out is no effect), and a StartRequests POST at the agent. Approvals travel through each
VM's real CommandProcessor and ledger to an in-memory IMDS that counts POSTs; it keeps every event
Scheduled for every VM, also once approved, so any second approval would be POSTed and counted.

A crash is a `Killed` (a BaseException, tests/kit/crash.py): nothing of the
invocation runs after it, not even the `except Exception` that gives a claim back. Crash points sit
before and after every call to a port (store, audit log, load balancer, command sender), so every
gap between two side effects is a place to die. A killed delivery is redelivered, either soon (it
meets the dead invocation's live claim and is bounced as busy) or after the claim's lease.

Builds on tests/unit/functions/test_process.py, which kills one chosen step of one event and
redelivers by hand: here six events, seeded random crash points and redelivery times, many seeds,
one run against Firestore, and effects compared with a run without crashes.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from agent.commands import CommandLedger, CommandProcessor
from agent.sources.azure.document import ScheduledEventsDocument, parse_scheduled_events
from functions.core.keys import event_key
from functions.core.policy import Policy, Pool
from functions.core.ports import (
    Admission,
    AuditLog,
    AuditRecord,
    Claim,
    Finishing,
    Glance,
    JsonObject,
    Parked,
    RecordedDrain,
    StateStore,
)
from functions.core.process import CLAIM_LEASE, Deps, process
from functions.local_app.store import SqliteStore
from tests.drills.conftest import drill_seed, say
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, Killed, RecordingReadiness, RecordingSender
from wire.commands import Command, encode_command
from wire.envelope import encode, envelope_for_event
from wire.errors import RetryableError
from wire.identity import ReporterName
from wire.model import Cloud, CommandResult, EventKind, EventSource, EventStatus, MaintenanceEvent

pytestmark = [pytest.mark.drill, pytest.mark.timeout(60)]

SEED = 20261122
SEEDS = 100  # schedules per drill on SQLite
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
VMS = tuple(f"web-{n}" for n in range(7))
CRASH_RATE = 0.02  # per crash point: about a third of the invocations die somewhere
TRANSIENT_RATE = 0.01  # per crash point: a call fails with a RetryableError instead
COPIES = 3  # every envelope is delivered this many times, crashes aside


@dataclass(frozen=True)
class Planned:
    event_id: str
    kind: EventKind
    steps: tuple[EventStatus, ...]
    resources: tuple[str, ...]
    source: EventSource = EventSource.PLATFORM
    duration: int = -1


S, ST, C, X = EventStatus.SCHEDULED, EventStatus.STARTED, EventStatus.COMPLETED, EventStatus.CANCELED
EVENTS = (
    Planned("E-REBOOT", EventKind.REBOOT, (S, ST, C), ("web-0", "web-1")),  # drain both, approve later
    Planned("E-USER", EventKind.REBOOT, (S, ST, C), ("web-2",), EventSource.USER),  # drain, approve at once
    Planned("E-FREEZE", EventKind.FREEZE, (S, ST, C), ("web-3",), duration=5),  # approve, no drain
    Planned("E-REDEPLOY", EventKind.REDEPLOY, (S, X), ("web-4",)),  # drain, approve, canceled: restore
    Planned("E-HARDWARE", EventKind.REBOOT, (ST, C), ("web-5",)),  # no notice: drain, never approve
    Planned("E-TERMINATE", EventKind.TERMINATE, (S, ST, C), ("web-6",)),  # drain, approve, VM gone
)
AZURE_TYPE = {
    EventKind.REBOOT: "Reboot",
    EventKind.FREEZE: "Freeze",
    EventKind.REDEPLOY: "Redeploy",
    EventKind.TERMINATE: "Terminate",
}
# What every schedule must come to: one drain per VM, one restore (the terminated VM is gone), one
# POST per approved event, which starts it for every VM it names (a Started event without notice is
# never approved).
EXPECTED_REMOVED = {vm: 1 for vm in VMS if vm != "web-3"}
EXPECTED_RESTORED = {vm: 1 for vm in VMS if vm not in ("web-3", "web-6")}
EXPECTED_POSTS = {"E-REBOOT": 1, "E-USER": 1, "E-FREEZE": 1, "E-REDEPLOY": 1, "E-TERMINATE": 1}


def reporters(planned: Planned) -> tuple[str, ...]:
    """Every VM an event concerns reports it (each report moves its own VM), and one it does not
    (Azure broadcasts; with --forward all such a report arrives, and moves nothing)."""
    outside = next(vm for vm in VMS if vm not in planned.resources)
    return (*planned.resources, outside)


def body(planned: Planned, status: EventStatus, reporter: str, at: datetime) -> bytes:
    event = azure_event(
        event_id=planned.event_id,
        kind=planned.kind,
        status=status,
        reporter=reporter,
        resources=planned.resources,
        not_before=None if planned.steps[0] is ST else T0 + timedelta(days=1),
        duration_seconds=planned.duration,
        event_source=planned.source,
        description=f"{planned.kind.value} drill event",
        raw={"EventId": planned.event_id},
    )
    return encode(envelope_for_event(event, at))


# ---------------------------------------------------------------------------------------- crashes


@dataclass
class Crashes:
    """At a crash point, kills the invocation (`rate`) or fails the call as a transient error would
    (`transient`: a timeout whose answer was lost), with seeded probabilities."""

    rng: random.Random
    rate: float
    transient: float = 0.0
    hit: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)

    def point(self, where: str) -> None:
        roll = self.rng.random()
        if roll < self.rate:
            self.hit[where] += 1
            raise Killed()
        if roll < self.rate + self.transient:
            self.failed[where] += 1
            raise RetryableError(f"{where}: timed out (drill)")

    def at(self, where: str) -> Callable[[object], None]:
        """The crash point `where`, as a hook of a fake of the kit."""
        return lambda _: self.point(where)


@dataclass
class _CrashingFinishing:
    """A store's `Finishing` with a crash point before and after its own writes (forgetting the drains
    put back, completing the claim); writes an audit log folds into its commit (`writes`: Firestore)
    are that commit's, between the audit log's crash points."""

    inner: Finishing
    crashes: Crashes

    def write(self) -> None:
        self.crashes.point("before store.complete")
        self.inner.write()
        self.crashes.point("after store.complete")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class CrashingStore:
    """A StateStore and AuditLog with a crash point before and after every call."""

    store: StateStore
    audit: AuditLog
    crashes: Crashes

    def claim(self, key: str, now: datetime, lease: timedelta) -> Claim:
        self.crashes.point("before store.claim")
        claim = self.store.claim(key, now, lease)
        self.crashes.point("after store.claim")
        return claim

    def finishing(self, key: str, now: datetime, forgotten: Sequence[tuple[str, str]] = ()) -> Finishing:
        return _CrashingFinishing(self.store.finishing(key, now, forgotten), self.crashes)

    def complete(self, key: str, now: datetime) -> None:
        self.crashes.point("before store.complete")
        self.store.complete(key, now)
        self.crashes.point("after store.complete")

    def abandon(self, key: str, now: datetime) -> None:
        self.crashes.point("before store.abandon")
        self.store.abandon(key, now)
        self.crashes.point("after store.abandon")

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
        self.crashes.point("before store.reserve")
        admitted = self.store.reserve(
            pool, event_key, vms, limit, now=now, expires_at=expires_at, alone=alone, seen=seen
        )
        self.crashes.point("after store.reserve")
        return admitted

    def release(self, pool: str, event_key: str) -> None:
        self.crashes.point("before store.release")
        self.store.release(pool, event_key)
        self.crashes.point("after store.release")

    def record_drain(self, event_key: str, vm: str, memento: JsonObject) -> None:
        self.crashes.point("before store.record_drain")
        self.store.record_drain(event_key, vm, memento)
        self.crashes.point("after store.record_drain")

    def record_drain_unless(self, event_key: str, vm: str, memento: JsonObject, ended: str) -> bytes | None:
        self.crashes.point("before store.record_drain")
        stored = self.store.record_drain_unless(event_key, vm, memento, ended)
        self.crashes.point("after store.record_drain")
        return stored

    def glance(
        self, recall: Sequence[str], event_key: str = "", vms: Sequence[str] = (), pools: Sequence[str] = ()
    ) -> Glance:
        self.crashes.point("before store.glance")
        found = self.store.glance(recall, event_key, vms, pools)
        self.crashes.point("after store.glance")
        return found

    def drains(self, event_key: str) -> Mapping[str, JsonObject]:
        self.crashes.point("before store.drains")
        found = self.store.drains(event_key)
        self.crashes.point("after store.drains")
        return found

    def forget_drain(self, event_key: str, vm: str) -> None:
        self.crashes.point("before store.forget_drain")
        self.store.forget_drain(event_key, vm)
        self.crashes.point("after store.forget_drain")

    def all_drains(self) -> Sequence[RecordedDrain]:
        return self.store.all_drains()

    def remember(self, key: str, value: bytes) -> bytes:
        self.crashes.point("before store.remember")
        stored = self.store.remember(key, value)
        self.crashes.point("after store.remember")
        return stored

    def recall(self, key: str) -> bytes | None:
        self.crashes.point("before store.recall")
        stored = self.store.recall(key)
        self.crashes.point("after store.recall")
        return stored

    def park(self, pool: str, event_key: str, envelope: bytes, now: datetime) -> None:
        self.crashes.point("before store.park")
        self.store.park(pool, event_key, envelope, now)
        self.crashes.point("after store.park")

    def parked(self, pool: str) -> Sequence[Parked]:
        self.crashes.point("before store.parked")
        found = self.store.parked(pool)
        self.crashes.point("after store.parked")
        return found

    def unpark(self, pool: str, event_key: str) -> None:
        self.crashes.point("before store.unpark")
        self.store.unpark(pool, event_key)
        self.crashes.point("after store.unpark")

    def append(self, record: AuditRecord) -> None:
        self.crashes.point("before audit.append")
        self.audit.append(record)
        self.crashes.point("after audit.append")

    def append_all(self, records: Sequence[AuditRecord], then: Finishing | None = None) -> None:
        self.crashes.point("before audit.append")
        self.audit.append_all(records, then)
        self.crashes.point("after audit.append")

    def query(self, *, vm: str | None = None, event_id: str | None = None) -> Sequence[AuditRecord]:
        return self.audit.query(vm=vm, event_id=event_id)


# ---------------------------------------------------------------------------------------- the agents


@dataclass
class Imds:
    """IMDS for the whole availability set, in memory. One approval starts an event for every VM it
    names (as Azure documents), but here every event stays Scheduled for every VM, also once
    approved, so a second approval — by the same VM or another — would be POSTed (and counted)
    instead of refused. `posts` counts POSTs per event, of all VMs."""

    posts: Counter[str] = field(default_factory=Counter)

    def of(self, vm: str) -> VmImds:
        return VmImds(self, vm)


@dataclass
class VmImds:
    """What one VM sees of `Imds`, and the approvals it POSTs."""

    imds: Imds
    vm: str

    def fetch_document(self) -> ScheduledEventsDocument:
        events = [
            {
                "EventId": planned.event_id,
                "EventType": AZURE_TYPE[planned.kind],
                "EventStatus": "Scheduled",
                "Resources": list(planned.resources),
                "NotBefore": "",
                "EventSource": planned.source.value.title(),
                "DurationInSeconds": planned.duration,
            }
            for planned in EVENTS
        ]
        return parse_scheduled_events(json.dumps({"DocumentIncarnation": 1, "Events": events}))

    def post_approval(self, event_id: str) -> None:
        self.imds.posts[event_id] += 1


class Agents:
    """Every VM's real command processor and ledger, taking each command the functions send."""

    def __init__(self, directory: Path, clock: FakeClock) -> None:
        self.imds = Imds()
        self.sent: list[tuple[str, str, str, bytes]] = []  # (event_id, target, command_id, body) per send
        self.results: list[CommandResult] = []
        self._ledgers = [CommandLedger(directory / f"{vm}.db", clock=clock) for vm in VMS]
        self._processors = {
            vm: CommandProcessor(
                vm_name=vm,
                cloud=Cloud.AZURE,
                ledger=ledger,
                readiness=RecordingReadiness(),
                approver=self.imds.of(vm),
                verify_key=None,
                dry_run=False,
                clock=clock,
            )
            for vm, ledger in zip(VMS, self._ledgers)
        }

    def deliver(self, command: Command) -> None:
        body = encode_command(command)
        self.sent.append((command.event_id, command.target, command.command_id, body))
        result = self._processors[command.target].handle(body)
        if result is not None:
            self.results.append(result)

    def run_due(self) -> None:
        for processor in self._processors.values():
            self.results.extend(processor.run_due())

    def approvals(self) -> dict[str, set[tuple[str, str]]]:
        """Distinct approval commands (command id, target VM) sent per event."""
        found: dict[str, set[tuple[str, str]]] = {}
        for event_id, target, command_id, _ in self.sent:
            found.setdefault(event_id, set()).add((command_id, target))
        return found

    def resent_identically(self) -> bool:
        bodies: dict[str, set[bytes]] = {}
        for _, _, command_id, sent in self.sent:
            bodies.setdefault(command_id, set()).add(sent)
        return all(len(variants) == 1 for variants in bodies.values())

    def close(self) -> None:
        for ledger in self._ledgers:
            ledger.close()


# ---------------------------------------------------------------------------------------- a run


@dataclass
class Stream:
    """Messages one bus delivers in order: the next one only after the previous one was acknowledged."""

    messages: deque[bytes]
    ready_at: datetime = T0


@dataclass
class Run:
    pool: FakeBalancer
    agents: Agents
    crashes: Crashes
    store: StateStore
    deliveries: int = 0
    bounced: int = 0  # deliveries that met a live claim, or a transient error
    outcomes: Counter[str] = field(default_factory=Counter)


def streams_for(rng: random.Random, *, ordered: bool) -> list[Stream]:
    """Every (event, reporter) pair's steps, each message `COPIES` times in a row. Ordered: one stream
    per pair (sessions / ordering keys). Unordered: one message per stream, all at random times."""
    found = []
    for planned in EVENTS:
        for reporter in reporters(planned):
            messages: deque[bytes] = deque()
            for index, status in enumerate(planned.steps):
                at = T0 + timedelta(minutes=10 * index, seconds=rng.uniform(0, 30))
                messages.extend([body(planned, status, reporter, at)] * COPIES)
            if ordered:
                found.append(Stream(messages))
            else:
                found.extend(
                    Stream(deque([message]), T0 + timedelta(seconds=rng.uniform(0, 900))) for message in messages
                )
    return found


def run(
    store: StateStore,
    audit: AuditLog,
    tmp: Path,
    rng: random.Random,
    *,
    crash_rate: float,
    ordered: bool,
    policy: Policy,
) -> Run:
    clock = FakeClock(T0, monotonic=T0.timestamp())  # the drill's time, of the functions and the agents
    crashes = Crashes(rng, crash_rate, transient=TRANSIENT_RATE if crash_rate else 0.0)
    pool = FakeBalancer({"web": VMS})
    for method in ("locate", "remove", "restore"):
        pool.on(method, crashes.at(f"before balancer.{method}"))
        pool.on(method, crashes.at(f"after balancer.{method}"), after=True)
    agents = Agents(tmp, clock)
    sender = RecordingSender()
    sender.on_send(crashes.at("before sender.send"))
    sender.on_send(agents.deliver)
    sender.on_send(crashes.at("after sender.send"), after=True)
    crashing = CrashingStore(store, audit, crashes)
    deps = Deps(
        store=crashing,
        balancer=pool,
        sender=sender,
        audit=crashing,
        policy=policy,
        verifier=ReporterName(),
        monotonic=clock.monotonic,
    )
    result = Run(pool, agents, crashes, store)
    streams = streams_for(rng, ordered=ordered)
    try:
        while any(stream.messages for stream in streams):
            waiting = [stream for stream in streams if stream.messages]
            ready = [stream for stream in waiting if stream.ready_at <= clock.now()]
            if not ready:
                clock.advance_to(min(stream.ready_at for stream in waiting))
                agents.run_due()
                continue
            stream = rng.choice(ready)
            result.deliveries += 1
            try:
                outcome = process(stream.messages[0], deps, clock.now())
            except Killed:
                # Redelivered soon (it meets the dead invocation's live claim) or after the lease.
                soon = rng.random() < 0.3
                stream.ready_at = clock.now() + (timedelta(seconds=10) if soon else CLAIM_LEASE + timedelta(seconds=1))
            except RetryableError:
                result.bounced += 1
                stream.ready_at = clock.now() + timedelta(seconds=rng.uniform(5, 60))
            else:
                result.outcomes[outcome.result] += 1
                stream.messages.popleft()
                stream.ready_at = clock.now() + timedelta(seconds=rng.uniform(0, 3))
            clock.advance(rng.uniform(0.05, 1.0))
            agents.run_due()
        # Held approvals run once their execute_at has come.
        clock.advance(timedelta(minutes=1))
        agents.run_due()
    finally:
        agents.close()
    return result


def sqlite_run(tmp_path: Path, seed: int, *, crash_rate: float, ordered: bool, policy: Policy) -> Run:
    store = SqliteStore(":memory:")
    directory = tmp_path / f"seed-{seed}-{crash_rate}-{ordered}"
    directory.mkdir()
    return run(store, store, directory, random.Random(seed), crash_rate=crash_rate, ordered=ordered, policy=policy)


def effects_of(result: Run) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    return dict(result.pool.went_out), dict(result.pool.came_back), dict(result.agents.imds.posts)


# ---------------------------------------------------------------------------------------- the drills

LONG_TTL = Policy(command_ttl_seconds=3600.0)  # approvals outlive several leases of crashed invocations


def test_crashes_and_triple_delivery_in_order_have_exactly_once_effects(tmp_path: Path) -> None:
    started = time.monotonic()
    seed = drill_seed(SEED)
    # GIVEN six events of an availability set (drain-and-approve, approve only, canceled, no notice,
    # terminate), each step reported by two VMs and delivered three times, in order per reporter;
    # and the same deliveries without a single crash, as the reference
    reference = sqlite_run(tmp_path, seed, crash_rate=0.0, ordered=True, policy=LONG_TTL)
    assert effects_of(reference) == (EXPECTED_REMOVED, EXPECTED_RESTORED, EXPECTED_POSTS)

    # WHEN 30 seeded schedules kill invocations at random points and redeliver them
    totals: Counter[str] = Counter()
    points: Counter[str] = Counter()
    for offset in range(SEEDS):
        chaos = sqlite_run(tmp_path, seed + offset, crash_rate=CRASH_RATE, ordered=True, policy=LONG_TTL)
        # THEN each schedule has the effects of the run without crashes: one drain per VM, one
        # restore, one POST per approved event, one approval command per event, re-sent identically
        assert effects_of(chaos) == effects_of(reference), f"seed {seed + offset}: {chaos.crashes.hit}"
        assert all(len(ids) == 1 for ids in chaos.agents.approvals().values()), f"seed {seed + offset}"
        assert chaos.agents.resent_identically(), f"seed {seed + offset}"
        assert chaos.pool.members("web") == [vm for vm in VMS if vm != "web-6"]
        totals.update(deliveries=chaos.deliveries, bounced=chaos.bounced, crashes=sum(chaos.crashes.hit.values()))
        totals.update(transient_failures=sum(chaos.crashes.failed.values()))
        totals.update(chaos.outcomes)
        points.update(chaos.crashes.hit)
    say(
        "function-crashes-ordered",
        seed=seed,
        schedules=SEEDS,
        **dict(totals),
        crash_points_hit=f"{len(points)} of {len(_all_points())}",
        never_hit=sorted(set(_all_points()) - set(points)),
        duration_s=round(time.monotonic() - started, 1),
    )


def test_crashes_and_triple_delivery_out_of_order_with_a_budget_leave_nothing_drained(tmp_path: Path) -> None:
    started = time.monotonic()
    seed = drill_seed(SEED)
    # GIVEN the same events in a pool that may have two VMs out at a time, every message on its own
    # at a random moment of 15 minutes (no order at all: a plain subscription, or a dead-letter resubmit)
    policy = Policy(command_ttl_seconds=3600.0, pools=(Pool("web", frozenset(VMS), max_drained=2),))
    totals: Counter[str] = Counter()
    points: Counter[str] = Counter()
    for offset in range(SEEDS):
        # WHEN invocations are killed at random points and redelivered
        chaos = sqlite_run(tmp_path, seed + offset, crash_rate=CRASH_RATE, ordered=False, policy=policy)
        where = f"seed {seed + offset}: {dict(chaos.crashes.hit)}"
        removed, restored, posts = effects_of(chaos)
        # THEN no VM was drained twice nor restored without a drain, no event was approved twice,
        # and every approval was one command, re-sent identically
        assert all(count <= 1 for count in removed.values()), where
        assert all(restored.get(vm, 0) <= removed.get(vm, 0) for vm in VMS), where
        assert all(count <= 1 for count in posts.values()), where
        assert "E-HARDWARE" not in posts, where
        assert all(len(ids) == 1 for ids in chaos.agents.approvals().values()), where
        assert chaos.agents.resent_identically(), where
        # ... and once every event has ended, nothing is left: every VM is back (but a terminated one),
        # no drain record, no waiting event, no budget slot held
        assert set(chaos.pool.members("web")) >= set(VMS) - {"web-6"}, where
        assert all(chaos.store.drains(event_key(_event(planned))) == {} for planned in EVENTS), where
        assert chaos.store.parked("web") == [], where
        assert _budget_is_free(chaos.store), where
        totals.update(deliveries=chaos.deliveries, bounced=chaos.bounced, crashes=sum(chaos.crashes.hit.values()))
        totals.update(drained=sum(removed.values()), posts=sum(posts.values()))
        totals.update(transient_failures=sum(chaos.crashes.failed.values()))
        totals.update(chaos.outcomes)
        points.update(chaos.crashes.hit)
    say(
        "function-crashes-unordered",
        seed=seed,
        schedules=SEEDS,
        **dict(totals),
        crash_points_hit=f"{len(points)} of {len(_all_points())}",
        never_hit=sorted(set(_all_points()) - set(points)),
        duration_s=round(time.monotonic() - started, 1),
    )


@pytest.mark.peer
def test_crashes_and_triple_delivery_against_firestore_have_exactly_once_effects(
    tmp_path: Path, firestore_emulator: str
) -> None:
    from google.cloud import firestore

    from functions.gcp_app.firestore_audit import FirestoreAuditLog
    from functions.gcp_app.firestore_store import FirestoreStateStore

    started = time.monotonic()
    seed = drill_seed(SEED)
    # GIVEN the Firestore store and audit log (Google's emulator, a project of this drill's own)
    client = firestore.Client(project=f"mbridge-drill-{uuid.uuid4().hex[:12]}")
    try:
        # WHEN one seeded schedule kills invocations at random points and redelivers every envelope
        chaos = run(
            FirestoreStateStore(client),
            FirestoreAuditLog(client),
            tmp_path,
            random.Random(seed),
            crash_rate=CRASH_RATE,
            ordered=True,
            policy=LONG_TTL,
        )
    finally:
        client.close()  # type: ignore[no-untyped-call]  # the library leaves it unannotated
    # THEN the effects are exactly once, as on SQLite
    assert effects_of(chaos) == (EXPECTED_REMOVED, EXPECTED_RESTORED, EXPECTED_POSTS), dict(chaos.crashes.hit)
    assert all(len(ids) == 1 for ids in chaos.agents.approvals().values())
    assert chaos.agents.resent_identically()
    say(
        "function-crashes-firestore",
        seed=seed,
        deliveries=chaos.deliveries,
        bounced=chaos.bounced,
        crashes=sum(chaos.crashes.hit.values()),
        **dict(chaos.outcomes),
        duration_s=round(time.monotonic() - started, 1),
    )


def _event(planned: Planned) -> MaintenanceEvent:
    return azure_event(event_id=planned.event_id, kind=planned.kind, resources=planned.resources)


def _budget_is_free(store: StateStore) -> bool:
    """No event holds a slot: with a limit of 0, only a pool where nothing is reserved admits."""
    # (at a moment before any drill's events: no reservation has expired yet)
    probe_at = datetime(2000, 1, 1, tzinfo=timezone.utc)
    admitted = store.reserve("web", "drill-probe", ["web-0"], 0, now=probe_at, expires_at=probe_at).admitted
    store.release("web", "drill-probe")
    return admitted


def _all_points() -> list[str]:
    store = ["claim", "complete", "abandon", "reserve", "release", "record_drain", "drains", "forget_drain"]
    store += ["remember", "recall", "park", "parked", "unpark"]
    ports = [f"store.{name}" for name in store] + ["audit.append", "sender.send"]
    ports += [f"balancer.{name}" for name in ("locate", "remove", "restore")]
    return [f"{when} {port}" for port in ports for when in ("before", "after")]
