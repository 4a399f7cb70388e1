"""Fan-in: one Azure event whose Resources hold many VMs, seen by every VM of the availability set.

Azure broadcasts an event to the whole availability set, so every agent of the set sees it. A
verified report speaks only for its own VM: each VM in Resources is drained on its own report, and
the event is approved once, by the report that finds every VM in Resources out of its pool (one
approval starts the event for all of them, as Azure documents), and a report by a VM not in
Resources is audited `not-self` and does nothing. By default (`--forward own`) an agent publishes
only the events whose Resources name its VM, so those reports are never sent; `--forward all`
sends them, and each costs the functions an invocation that ends in `not-self`.

- agents50: 50 real agents (threads of this process) on the embedded bus, each with its own
  simulator endpoint (one simulator, 50 consecutive ports, one shared event store), the local
  function host with its SQLite store and local pool, wired as deployed (bench/functions_worlds.py:
  proofs verified with the simulator's trust, signed commands). One platform Reboot for the first
  `RESOURCES_50` VMs, seen by all 50; the policy has no drain period, so the function drains each VM
  and approves the event as soon as the last of them is out. Run twice, on fresh worlds: the agents
  with `forward="own"` (their default), then with `forward="all"` (what the option removes).
  published = agents whose outbox published the event's `scheduled` envelope; invocations = those
  messages on the bus, each one function invocation; approvals = StartRequests POSTs naming the
  event that the simulator received from the VMs; drains = `drain` actions in the functions' audit
  log; not-self = VMs whose report was audited `not-self`; settle = from the notice (the simulator's
  log) until every VM in Resources is out of the pool and the approval that starts the event was
  accepted. A run ends once every agent polled after the notice and the host read everything on the
  bus.
- synthetic1000: the same kind of event as 1,000 VMs publish it with `--forward all` (built as the
  agent builds it: one envelope per reporter, all with the same id), `RESOURCES_1000` of them in
  Resources, delivered by `WORKERS` threads — each with its own connection to one file SQLite
  store, like that many function instances — to `process`, with a tenth of them delivered twice
  (the bus's at-least-once) and every delivery that meets the claim busy delivered again
  `REDELIVERY_DELAY` later. Each envelope would carry its VM's proof; a fake verifier of the
  `IdentityVerifier` port (`ReporterName`) takes the reporter as proven, so the proofs' checking
  is not in the figures. The load balancer and command channel are in-memory fakes. Then the
  same with only the `RESOURCES_1000` own reports (what `--forward own` sends), delivered the
  same way. approvals = distinct approve commands sent (a command sent again by a concurrent
  instance is one); drains = VMs taken out of the pool; not-self =
  reporters whose report was refused as `not-self`; invocations = calls of `process`; settle =
  from the first delivery until the last one was acknowledged.
- The same fan-in on Azurite and the Firestore emulator, each reporter's three steps, with the
  drain latency of each VM in Resources and the store's round trips: bench/fan_in_stores.py.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import requests

from bench.context import BenchContext
from bench.functions_events import envelope_body, new_event_id, reboot_entry, reported_event
from bench.functions_fakes import MemoryPool, MemorySender
from bench.functions_witness import accepted_approvals, approval_posts, notices, published
from bench.functions_worlds import POLL_INTERVAL, EmbeddedBench, warnings_to
from bench.results import Figure, exactly
from functions.core.policy import Policy
from functions.core.ports import AuditRecord
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from wire.commands import CommandType
from wire.envelope import decode, event_envelope_id
from wire.errors import RetryableError
from wire.identity import ReporterName
from wire.model import Cloud, EventStatus, MaintenanceEvent

AGENTS = 50
RESOURCES_50 = 10  # one update domain of a 50-VM availability set
REPORTERS = 1000
RESOURCES_1000 = 100
WORKERS = 16
REDELIVERED_SHARE = 10  # every tenth envelope is delivered twice
REDELIVERY_DELAY = 0.05
SETTLE_TIMEOUT = 60.0
FINAL_TIMEOUT = 30.0
SEED = 20240502
# The VMs' pools here are read directly, no probe between: out at once (readiness_probe_seconds 0).
POLICY = Policy(drain_period_seconds=0.0, readiness_probe_seconds=0.0)
# The simulator's answer to the StartRequests POST that starts the event.
COUNTED = ("accepted",)


# ---- 50 real agents


@dataclass(frozen=True)
class AgentsRun:
    forward: str
    notice: float
    settled_at: float | None
    published: list[str]  # VMs whose agent published the event's scheduled envelope
    invocations: int  # those messages on the bus: one function invocation each
    approvals: list[Mapping[str, object]]  # StartRequests POSTs from the VMs naming the event
    drains: list[str]
    removals: list[str]
    outcomes: Counter[str]  # the functions' audit of the reports: event (acted on), not-self, ...
    not_self: list[str]  # VMs whose report was audited not-self
    problems: list[str]

    @property
    def settle(self) -> float | None:
        return None if self.settled_at is None else self.settled_at - self.notice

    @property
    def approvers(self) -> list[str]:
        return sorted(str(post.get("vm")) for post in self.approvals)

    @property
    def approval_outcomes(self) -> Counter[str]:
        return Counter(str(post.get("outcome")) for post in self.approvals)


def agents_run(world: EmbeddedBench, resources: list[str]) -> AgentsRun:
    sim = world.simulator
    event_id = new_event_id()
    body = {
        "event_type": "Reboot",
        "event_id": event_id,
        "resources": resources,
        "event_source": "Platform",  # one approval starts it for every VM in Resources
    }
    before = {vm: traffic["total"] for vm, traffic in sim.traffic().items()}
    requests.post(f"{sim.base_urls[0]}/_sim/events", json=body, timeout=5).raise_for_status()
    key = event_id.lower()
    envelope_id = event_envelope_id(Cloud.AZURE, event_id, EventStatus.SCHEDULED)
    notice = notices(sim.log_entries())[key]
    assert world.balancer is not None
    assert world.store is not None
    problems: list[str] = []
    # Settle: watch only the two witnesses it needs, so the bench's own reads cost the run little.
    settled_at: float | None = None
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while settled_at is None and time.monotonic() < deadline:
        approved = accepted_approvals(sim.approvals()).get(key)
        removed = {call.vm: call.at for call in reversed(world.balancer.removals(after=notice))}
        if approved is not None and set(resources) <= set(removed):
            settled_at = max(approved, *(removed[vm] for vm in resources))
            if approved < max(removed[vm] for vm in resources):
                problems.append("the event was approved before every VM in Resources was out of the pool")
        else:
            time.sleep(0.02)
    if settled_at is None:
        problems.append(f"not settled within {SETTLE_TIMEOUT:g} s")
    # Final once every agent polled since the notice (a request begun after it: two more than
    # before) and the host read everything on the bus.
    deadline = time.monotonic() + FINAL_TIMEOUT
    while time.monotonic() < deadline:
        traffic = sim.traffic()
        polled = all(traffic.get(vm, {"total": 0})["total"] >= before.get(vm, 0) + 2 for vm in world.vms)
        if polled and _host_caught_up(world):
            break
        time.sleep(0.1)
    else:
        problems.append(f"not every agent polled, or the host did not read the bus, within {FINAL_TIMEOUT:g} s")
    records = world.store.query(event_id=event_id)
    reports = [record for record in records if record.envelope_id == envelope_id]
    return AgentsRun(
        forward=world.forward,
        notice=notice,
        settled_at=settled_at,
        published=[vm for vm in world.vms if published(world.state_dir(vm) / "agent.db", envelope_id)],
        invocations=_on_bus(world, envelope_id),
        approvals=approval_posts(sim.approvals(), event_id),
        drains=[record.vm for record in records if record.kind == "action" and record.action == "drain"],
        removals=[call.vm for call in world.balancer.removals(after=notice)],
        outcomes=report_outcomes(reports),
        not_self=sorted({record.vm for record in reports if record.kind == "not-self"}),
        problems=problems,
    )


def report_outcomes(records: Sequence[AuditRecord]) -> Counter[str]:
    """How the functions took each report: `event` (acted on), `not-self`, `unverified`, `duplicate`."""
    return Counter(record.kind for record in records if record.kind in ("event", "not-self", "unverified", "duplicate"))


def _on_bus(world: EmbeddedBench, envelope_id: str) -> int:
    """How many reports of the event the bus holds: each VM's has a message id of its own."""
    assert world.bus is not None
    return sum(1 for message in world.bus.read_events(0, limit=100_000) if message.envelope_id == envelope_id)


def _host_caught_up(world: EmbeddedBench) -> bool:
    assert world.bus is not None
    return world.bus.position("functions") >= world.bus.last_event_seq()


def run_agents(workdir: Path, forward: str) -> AgentsRun:
    vms = [f"fan-{index:02d}" for index in range(AGENTS)]
    with warnings_to(workdir / "warnings.log"):
        world = EmbeddedBench(workdir, vms, POLICY, forward=forward).start()
        try:
            return agents_run(world, vms[:RESOURCES_50])
        finally:
            world.close()


def describe_run(run: AgentsRun) -> str:
    text = (
        f"--forward {run.forward}: {len(run.published)} agents published the event, {run.invocations} function "
        f"invocations, reports taken {dict(sorted(run.outcomes.items()))}"
    )
    if run.problems:
        text += "; " + "; ".join(run.problems)
    return text


def agents_run_figures(name: str, run: AgentsRun, resources: Sequence[str], setup: str) -> list[Figure]:
    """approvals, drains, not-self and settle of one run; each VM in Resources drained once, the event
    approved once, by one of them."""
    drained_once = sorted(run.drains) == sorted(resources)
    approved_once = len(run.approvers) == 1 and run.approvers[0] in resources
    counted = sum(run.approval_outcomes[outcome] for outcome in COUNTED)
    outcomes = ", ".join(f"{count} {outcome}" for outcome, count in sorted(run.approval_outcomes.items()))
    return [
        Figure(
            f"{name}.approvals",
            float(len(run.approvals)),
            "count",
            exactly(1),
            f"StartRequests POSTs naming the event received by the simulator "
            f"({'one, from a VM in Resources' if approved_once else 'NOT one, from a VM in Resources'}; "
            f"{counted} counted: {outcomes or 'none'}); {setup}",
            1,
        ),
        Figure(
            f"{name}.drains",
            float(len(run.drains)),
            "count",
            exactly(len(resources)),
            f"drain actions in the audit log ({'each VM in Resources once' if drained_once else 'NOT each VM once'}; "
            f"{len(run.removals)} removals from the pool); {setup}",
            1,
        ),
        Figure(
            f"{name}.not_self",
            float(len(run.not_self)),
            "count",
            None,
            f"VMs whose report the functions audited not-self (reports of VMs not in Resources); {setup}",
            1,
        ),
        Figure(
            f"{name}.settle",
            run.settle,
            "s",
            None,
            "notice → every VM in Resources out of the pool and the approval that starts the event accepted by "
            f"the simulator; {setup}",
            1,
        ),
    ]


def agents_figures(context: BenchContext) -> list[Figure]:
    vms = [f"fan-{index:02d}" for index in range(AGENTS)]
    resources = vms[:RESOURCES_50]
    own = run_agents(context.dir("fan_in-agents-own"), "own")
    every = run_agents(context.dir("fan_in-agents-all"), "all")
    name = f"fan_in.agents{AGENTS}"
    setup = (
        f"{AGENTS} agents polling at {POLL_INTERVAL:g} s, one platform Reboot of {RESOURCES_50} of them, seen by all"
    )
    own_setup = f"{setup}; {describe_run(own)}"
    all_setup = f"{setup}; {describe_run(every)}"
    saved = every.invocations - own.invocations
    return [
        Figure(
            f"{name}.published",
            float(len(own.published)),
            "count",
            exactly(len(resources)),
            f"agents whose outbox published the event (--forward own, the default): "
            f"{'the VMs in Resources' if own.published == resources else 'NOT the VMs in Resources'}; {own_setup}",
            1,
        ),
        Figure(
            f"{name}.invocations",
            float(own.invocations),
            "count",
            None,
            f"the event's reports on the bus, one function invocation each (--forward own); {own_setup}",
            1,
        ),
        *agents_run_figures(name, own, resources, own_setup),
        Figure(
            f"{name}.forward_all.published",
            float(len(every.published)),
            "count",
            None,
            f"agents whose outbox published the event (--forward all, a fresh world); {all_setup}",
            1,
        ),
        Figure(
            f"{name}.forward_all.invocations",
            float(every.invocations),
            "count",
            None,
            f"the event's reports on the bus, one function invocation each (--forward all); {all_setup}",
            1,
        ),
        *agents_run_figures(f"{name}.forward_all", every, resources, all_setup),
        Figure(
            f"{name}.invocations_saved",
            float(saved),
            "count",
            None,
            f"function invocations --forward own saves on this event: {every.invocations} with all, "
            f"{own.invocations} with own (the {AGENTS - RESOURCES_50} reports of VMs not in Resources, each audited "
            "not-self and doing nothing)",
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
    not_self: set[str] = field(default_factory=set)  # reporters refused as not-self

    @property
    def invocations(self) -> int:
        """Calls of `process`: every delivery, busy redeliveries included."""
        return sum(self.outcomes.values()) + self.busy + self.errors


def reporter_envelopes(count: int, resources: int) -> tuple[list[bytes], list[str]]:
    """The envelope each of `count` VMs publishes for one platform Reboot of the first `resources`
    (as with `--forward all`: every VM that sees the event reports it)."""
    vms = [f"vm-{index:04d}" for index in range(count)]
    seen = datetime.now(timezone.utc)
    entry = reboot_entry(new_event_id(), vms[:resources], seen, source="Platform")
    # Each agent saw the document at its own poll, within one interval.
    bodies = [
        envelope_body(reported_event(entry, vm, incarnation=2), seen + timedelta(milliseconds=index % 1000))
        for index, vm in enumerate(vms)
    ]
    return bodies, vms[:resources]


def _event(body: bytes) -> MaintenanceEvent:
    event = decode(body).data
    assert isinstance(event, MaintenanceEvent)
    return event


def own_reports(bodies: Sequence[bytes]) -> list[bytes]:
    """What `--forward own` sends of them: the reports whose Resources name their reporter."""
    return [body for body in bodies if (event := _event(body)).reporter in event.resources]


def deliver(bodies: list[bytes], path: Path, pool: MemoryPool, sender: MemorySender) -> tuple[Deliveries, float]:
    """Deliver every body (and a tenth twice) from WORKERS threads; returns the record and the start time."""
    rng = random.Random(SEED)
    stream = bodies + bodies[::REDELIVERED_SHARE]
    rng.shuffle(stream)
    reporters = {body: _event(body).reporter for body in bodies}
    inbox: queue.Queue[bytes] = queue.Queue()
    for body in stream:
        inbox.put(body)
    record = Deliveries(Counter())
    lock = threading.Lock()
    stores = [SqliteStore(path) for _ in range(WORKERS)]

    def worker(store: SqliteStore) -> None:
        # The fake verifier: each envelope's reporter is taken as proven (its proof is not checked).
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
                if outcome.result == "not-self":
                    record.not_self.add(reporters[body])
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


@dataclass(frozen=True)
class SyntheticRun:
    reports: int
    record: Deliveries
    started: float
    approvals: list[str]  # the VM each distinct approve command went to
    drains: Counter[str]  # VM → times taken out of the pool

    @property
    def settle(self) -> float:
        return self.record.last_ack - self.started


def synthetic_run(bodies: list[bytes], directory: Path) -> SyntheticRun:
    pool, sender = MemoryPool(), MemorySender()
    path = directory / "functions.db"
    SqliteStore(path).close()  # the schema exists before the instances race to create it
    with warnings_to(directory / "warnings.log"):  # a not-self report is a warning of the core's
        record, started = deliver(bodies, path, pool, sender)
    # A command sent again (a concurrent instance found every VM out too) is the same command.
    approvals = list({command.command_id: command.target for command in sender.commands(CommandType.APPROVE)}.values())
    return SyntheticRun(len(bodies), record, started, approvals, Counter(pool.removed))


def describe_synthetic(run: SyntheticRun) -> str:
    record = run.record
    text = (
        f"{run.reports} reports, {run.reports // REDELIVERED_SHARE + (run.reports % REDELIVERED_SHARE > 0)} of them "
        f"delivered twice, {WORKERS} instances on one file SQLite store; {record.invocations} invocations, "
        f"outcomes {dict(sorted(record.outcomes.items()))}, {record.busy} busy-claim redeliveries"
    )
    if record.errors:
        text += f", {record.errors} deliveries FAILED"
    return text


def synthetic_run_figures(name: str, run: SyntheticRun, resources: Sequence[str], setup: str) -> list[Figure]:
    approved_once = len(run.approvals) == 1 and run.approvals[0] in resources
    drained_once = sorted(run.drains) == sorted(resources) and set(run.drains.values()) == {1}
    each = "each VM in Resources once" if drained_once else "NOT each VM once"
    return [
        Figure(
            f"{name}.approvals",
            float(len(run.approvals)),
            "count",
            exactly(1),
            f"distinct approve commands sent ({'one' if approved_once else 'NOT one'}, to a VM in Resources); {setup}",
            1,
        ),
        Figure(
            f"{name}.drains",
            float(sum(run.drains.values())),
            "count",
            exactly(len(resources)),
            f"VMs taken out of the pool ({each}); {setup}",
            1,
        ),
        Figure(
            f"{name}.invocations",
            float(run.record.invocations),
            "count",
            None,
            f"calls of process, duplicates and busy-claim redeliveries included; {setup}",
            1,
        ),
        Figure(
            f"{name}.settle",
            run.settle,
            "s",
            None,
            f"first delivery → the last delivery acknowledged; {setup}",
            run.record.invocations,
        ),
    ]


def synthetic_figures(context: BenchContext) -> list[Figure]:
    bodies, resources = reporter_envelopes(REPORTERS, RESOURCES_1000)
    every = synthetic_run(bodies, context.dir("fan_in-synthetic-all"))
    own = synthetic_run(own_reports(bodies), context.dir("fan_in-synthetic-own"))
    event = (
        f"one platform Reboot of {RESOURCES_1000} VMs seen by {REPORTERS}; each reporter taken as proven by a fake "
        "verifier (ReporterName: proofs not checked)"
    )
    all_setup = f"{event}; --forward all: {describe_synthetic(every)}"
    own_setup = f"{event}; --forward own (the {RESOURCES_1000} own reports only): {describe_synthetic(own)}"
    others = REPORTERS - RESOURCES_1000
    name = f"fan_in.synthetic{REPORTERS}"
    return [
        *synthetic_run_figures(name, every, resources, all_setup),
        Figure(
            f"{name}.not_self",
            float(len(every.record.not_self)),
            "count",
            exactly(others),
            f"reporters whose report was refused as not-self (the {others} not in Resources; "
            f"{every.record.outcomes['not-self']} not-self outcomes, redeliveries included); {all_setup}",
            1,
        ),
        *synthetic_run_figures(f"{name}.forward_own", own, resources, own_setup),
        Figure(
            f"{name}.invocations_saved",
            float(every.record.invocations - own.record.invocations),
            "count",
            None,
            f"invocations --forward own saves: {every.record.invocations} with all, {own.record.invocations} with own; "
            f"settle {every.settle:.3f} s with all, {own.settle:.3f} s with own",
            1,
        ),
    ]


def run(context: BenchContext) -> list[Figure]:
    # The same fan-in on the cloud stores' emulators (imported here: it builds on this module).
    from bench import fan_in_stores

    return [*agents_figures(context), *synthetic_figures(context), *fan_in_stores.run(context)]
