"""Fan-in: one Azure event whose Resources hold many VMs, reported by every VM that sees it.

Azure broadcasts an event to the whole availability set, so every agent of the set reports it,
with the same envelope id (design §3.1). Exactly one approval must reach IMDS and each VM in
Resources must be drained exactly once, however many reports arrive and however they race.

- agents50: 50 real agents (threads of this process) on the embedded bus, each with its own
  simulator endpoint (one simulator, 50 consecutive ports, one shared event store), the local
  function host with its SQLite store and local pool. One platform Reboot for the first
  `RESOURCES_50` VMs, seen by all 50; the policy has no drain period, so the function drains
  them and approves at once. approvals = StartRequests POSTs naming the event that the simulator
  received from the VMs; drains = `drain` actions in the functions' audit log; settle = from
  the notice (the simulator's log) until every VM in Resources is out of the pool and the
  approval was accepted by the simulator.
- synthetic1000: the same kind of event as 1,000 VMs would publish it (built as the agent builds
  it: one envelope per reporter, all with the same id), `RESOURCES_1000` of them in Resources,
  delivered by `WORKERS` threads — each with its own connection to one file SQLite store, like
  that many function instances — to `process`, with a tenth of them delivered twice (the bus's
  at-least-once) and every delivery that meets the claim busy delivered again `REDELIVERY_DELAY`
  later. The load balancer and command channel are in-memory fakes. approvals = approve commands
  sent; drains = VMs taken out of the pool; settle = from the first delivery until the last
  one was acknowledged.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import requests

from bench.context import BenchContext
from bench.functions_events import envelope_body, new_event_id, reboot_entry, reported_event
from bench.functions_fakes import MemoryPool, MemorySender
from bench.functions_witness import accepted_approvals, approval_posts, notices, published
from bench.functions_worlds import POLL_INTERVAL, EmbeddedBench, warnings_to
from bench.results import Figure, exactly
from functions.core.commands import CommandType
from functions.core.envelope import event_envelope_id
from functions.core.errors import RetryableError
from functions.core.identity import ReporterName
from functions.core.model import Cloud, EventStatus
from functions.core.policy import Policy
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore

AGENTS = 50
RESOURCES_50 = 10  # one update domain of a 50-VM availability set
REPORTERS = 1000
RESOURCES_1000 = 100
WORKERS = 16
REDELIVERED_SHARE = 10  # every tenth envelope is delivered twice
REDELIVERY_DELAY = 0.05
SETTLE_TIMEOUT = 60.0
SEED = 20240502
POLICY = Policy(drain_period_seconds=0.0)


# ---- 50 real agents


@dataclass(frozen=True)
class AgentsRun:
    notice: float
    settled_at: float | None
    reporters: int
    on_bus: int
    approvals: int
    accepted: int
    drains: list[str]
    removals: list[str]
    problems: list[str]


def agents_run(world: EmbeddedBench, resources: list[str]) -> AgentsRun:
    sim = world.simulator
    event_id = new_event_id()
    body = {"event_type": "Reboot", "event_id": event_id, "resources": resources, "event_source": "Platform"}
    requests.post(f"{sim.base_urls[0]}/_sim/events", json=body, timeout=5).raise_for_status()
    key = event_id.lower()
    envelope_id = event_envelope_id(Cloud.AZURE, event_id, EventStatus.SCHEDULED)
    notice = notices(sim.log_entries())[key]
    assert world.balancer is not None
    assert world.store is not None
    deadline = time.monotonic() + SETTLE_TIMEOUT
    settled_at: float | None = None
    reporters = 0
    while time.monotonic() < deadline:
        approved = accepted_approvals(sim.approvals()).get(key)
        removed = {call.vm: call.at for call in reversed(world.balancer.removals(after=notice))}
        if settled_at is None and approved is not None and set(resources) <= set(removed):
            settled_at = max(approved, *(removed[vm] for vm in resources))
        reporters = sum(published(world.state_dir(vm) / "agent.db", envelope_id) for vm in world.vms)
        # Final once every agent's report went through the bus and the host read all of it.
        if settled_at is not None and reporters == len(world.vms) and _host_caught_up(world):
            break
        time.sleep(0.1)
    problems = [] if settled_at is not None else [f"not settled within {SETTLE_TIMEOUT:g} s"]
    if reporters < len(world.vms):
        problems.append(f"only {reporters} of {len(world.vms)} agents published the event")
    posts = approval_posts(sim.approvals(), event_id)
    records = world.store.query(event_id=event_id)
    return AgentsRun(
        notice=notice,
        settled_at=settled_at,
        reporters=reporters,
        on_bus=_on_bus(world, envelope_id),
        approvals=len(posts),
        accepted=sum(1 for post in posts if post.get("outcome") == "accepted"),
        drains=[record.vm for record in records if record.kind == "action" and record.action == "drain"],
        removals=[call.vm for call in world.balancer.removals(after=notice)],
        problems=problems,
    )


def _on_bus(world: EmbeddedBench, envelope_id: str) -> int:
    """How many of the reports the bus kept (it detects duplicates by envelope id, as Service Bus does)."""
    assert world.bus is not None
    return sum(1 for message in world.bus.read_events(0, limit=100_000) if message.envelope_id == envelope_id)


def _host_caught_up(world: EmbeddedBench) -> bool:
    assert world.bus is not None
    return world.bus.position("functions") >= world.bus.last_event_seq()


def agents_figures(context: BenchContext) -> list[Figure]:
    workdir = context.dir("fan_in-agents")
    vms = [f"fan-{index:02d}" for index in range(AGENTS)]
    resources = vms[:RESOURCES_50]
    with warnings_to(workdir / "warnings.log"):
        world = EmbeddedBench(workdir, vms, POLICY).start()
        try:
            outcome = agents_run(world, resources)
        finally:
            world.close()
    name = f"fan_in.agents{AGENTS}"
    setup = (
        f"{AGENTS} agents polling at {POLL_INTERVAL:g} s, one platform Reboot of {RESOURCES_50} of them "
        f"seen by all; {outcome.reporters} agents published it, the bus kept {outcome.on_bus} (duplicate detection)"
    )
    problems = "; ".join(outcome.problems)
    if problems:
        setup += f"; {problems}"
    once_each = sorted(outcome.drains) == sorted(resources)
    settle = None if outcome.settled_at is None else outcome.settled_at - outcome.notice
    return [
        Figure(
            f"{name}.approvals",
            float(outcome.approvals),
            "count",
            exactly(1),
            f"StartRequests POSTs naming the event received by the simulator ({outcome.accepted} accepted); {setup}",
            1,
        ),
        Figure(
            f"{name}.drains",
            float(len(outcome.drains)),
            "count",
            exactly(len(resources)),
            f"drain actions in the audit log ({'each VM in Resources once' if once_each else 'NOT each VM once'}; "
            f"{len(outcome.removals)} removals from the pool); {setup}",
            1,
        ),
        Figure(
            f"{name}.settle",
            settle,
            "s",
            None,
            "notice → every VM in Resources out of the pool and the approval accepted by the simulator; " + setup,
            1,
        ),
    ]


# ---- 1,000 synthetic reporters


@dataclass
class Deliveries:
    """The delivery loop's record: outcomes of `process` and how often a busy claim was redelivered."""

    outcomes: Counter[str]
    busy: int = 0
    errors: int = 0
    last_ack: float = 0.0


def reporter_envelopes(count: int, resources: int) -> tuple[list[bytes], list[str]]:
    """The envelope each of `count` VMs publishes for one platform Reboot of the first `resources`."""
    vms = [f"vm-{index:04d}" for index in range(count)]
    seen = datetime.now(timezone.utc)
    entry = reboot_entry(new_event_id(), vms[:resources], seen, source="Platform")
    # Each agent saw the document at its own poll, within one interval.
    bodies = [
        envelope_body(reported_event(entry, vm, incarnation=2), seen + timedelta(milliseconds=index % 1000))
        for index, vm in enumerate(vms)
    ]
    return bodies, vms[:resources]


def deliver(bodies: list[bytes], path: Path, pool: MemoryPool, sender: MemorySender) -> tuple[Deliveries, float]:
    """Deliver every body (and a tenth twice) from WORKERS threads; returns the record and the start time."""
    rng = random.Random(SEED)
    stream = bodies + bodies[::REDELIVERED_SHARE]
    rng.shuffle(stream)
    inbox: queue.Queue[bytes] = queue.Queue()
    for body in stream:
        inbox.put(body)
    record = Deliveries(Counter())
    lock = threading.Lock()
    stores = [SqliteStore(path) for _ in range(WORKERS)]

    def worker(store: SqliteStore) -> None:
        deps = Deps(store=store, balancer=pool, sender=sender, audit=store, policy=POLICY, verifier=ReporterName())
        while True:
            try:
                body = inbox.get_nowait()
            except queue.Empty:
                return
            try:
                outcome = process(body, deps, datetime.now(timezone.utc))
            except RetryableError:
                # The bus gives it back a little later (a busy claim: another instance holds it).
                with lock:
                    record.busy += 1
                time.sleep(REDELIVERY_DELAY)
                inbox.put(body)
                continue
            except Exception:
                with lock:
                    record.errors += 1
                continue
            with lock:
                record.outcomes[outcome.result] += 1
                record.last_ack = time.time()

    threads = [threading.Thread(target=worker, args=(store,), name=f"instance-{i}") for i, store in enumerate(stores)]
    started = time.time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store in stores:
        store.close()
    return record, started


def synthetic_figures(context: BenchContext) -> list[Figure]:
    bodies, resources = reporter_envelopes(REPORTERS, RESOURCES_1000)
    pool, sender = MemoryPool(), MemorySender()
    path = context.dir("fan_in-synthetic") / "functions.db"
    SqliteStore(path).close()  # the schema exists before the instances race to create it
    record, started = deliver(bodies, path, pool, sender)
    approvals = len(sender.commands(CommandType.APPROVE))
    drains = sum(pool.removed.values())
    once_each = sorted(pool.removed) == sorted(resources) and set(pool.removed.values()) == {1}
    setup = (
        f"{REPORTERS} reporters of one platform Reboot of {RESOURCES_1000} VMs, {len(bodies) // REDELIVERED_SHARE} "
        f"delivered twice, {WORKERS} instances on one file SQLite store; outcomes "
        f"{dict(sorted(record.outcomes.items()))}, {record.busy} busy-claim redeliveries"
    )
    if record.errors:
        setup += f", {record.errors} deliveries FAILED"
    name = f"fan_in.synthetic{REPORTERS}"
    return [
        Figure(f"{name}.approvals", float(approvals), "count", exactly(1), f"approve commands sent; {setup}", 1),
        Figure(
            f"{name}.drains",
            float(drains),
            "count",
            exactly(RESOURCES_1000),
            f"VMs taken out of the pool ({'each VM in Resources once' if once_each else 'NOT each VM once'}); {setup}",
            1,
        ),
        Figure(
            f"{name}.settle",
            record.last_ack - started,
            "s",
            None,
            f"first delivery → the last delivery acknowledged; {setup}",
            sum(record.outcomes.values()),
        ),
    ]


def run(context: BenchContext) -> list[Figure]:
    return [*agents_figures(context), *synthetic_figures(context)]
