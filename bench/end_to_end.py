"""End-to-end latency of a user-initiated Reboot with no drain period: from the notice to the VM
drained, and to the approval received by IMDS.

The event is what the `azure-user-reboot` scenario scripts: a Reboot with EventSource User,
15 minutes of notice. The policy is the default with `drain_period_seconds` 0, so rule 4
applies: drain the VM, then approve at once. Agents poll IMDS once a second (the documented
interval and the agent's default).

- notice: when the simulator's document first showed the event (its log: "event <id> added").
- drained: embedded world — when the function host's `LocalPool.remove` returned (the local pool
  is what that world drains); Pub/Sub world — when the agent finished the `drain` command in
  its ledger, right after its `/readyz` turned unready (that world drains through /readyz).
- approved: when the simulator received the StartRequests POST it accepted (its approval log).

Events run in lanes, one VM each, a lane's next event only once its previous one is over and the
VM is back in its pool; lanes run side by side. Each notice waits a random part of a poll
interval first, so notices fall anywhere in the agents' poll cycle, as real ones do. Once an
event is approved and drained the bench ends it through the control API (the maintenance itself
is not measured). Before the measured events, each VM has one event of its own, reported apart
(`first_event`): it meets the cold paths — the function's first invocations, each agent's first
pull of its commands — which the steady state does not.

Extra figures break the path into the steps the other witnesses show: the agent saw it (the
envelope's time), the bus took it, the function picked it up (its decision record), the approve
command was on the bus, the agent began it (its command ledger); and `agent_approval`, the agent's
own share: from beginning the approve command to IMDS accepting the POST (a fresh GET of the
document, then the POST, both through its IMDS rate limiter, at most 4 requests in any second).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import requests

from bench.context import BenchContext
from bench.functions_events import new_event_id
from bench.functions_witness import (
    accepted_approvals,
    after_notice_ms,
    describe_sample,
    notices,
    summarise,
    where_the_time_goes,
)
from bench.functions_worlds import (
    POLL_INTERVAL,
    STAGES,
    EmbeddedBench,
    PubSubBench,
    World,
    lane_policy,
    warnings_to,
)
from bench.results import Figure, Target, at_most, latency_figures, percentile
from mbridge.demo.errors import DemoSetupError
from mbridge.demo.flows import AZURE_VMS

TARGET_MS = 1500.0
EMBEDDED_LANES = tuple(f"e2e-{index}" for index in range(5))
PUBSUB_LANES = AZURE_VMS  # the demo's Azure VMs: that world serves those
EVENT_TIMEOUT = 30.0
CHECK_EVERY = 0.025
SEED = 20240501

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout: float) -> T | None:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None or time.monotonic() >= deadline:
            return value
        time.sleep(CHECK_EVERY)


@dataclass(frozen=True)
class EventRun:
    event_id: str
    vm: str
    error: str | None = None


def inject_user_reboot(control_url: str, vm: str, event_id: str) -> None:
    """What the azure-user-reboot scenario adds, for `vm` alone, through the control API."""
    body = {"event_type": "Reboot", "event_id": event_id, "resources": [vm], "audience": [vm], "event_source": "User"}
    requests.post(f"{control_url}/_sim/events", json=body, timeout=5).raise_for_status()


def end_event(control_url: str, event_id: str) -> None:
    """Start the event now and complete it (Scheduled → Started → gone)."""
    for _ in range(3):
        if requests.post(f"{control_url}/_sim/events/{event_id}/advance", timeout=5).status_code == 404:
            return


def drive_lane(world: World, vm: str, count: int, rng: random.Random, runs: list[EventRun]) -> None:
    sim = world.simulator
    control = sim.base_urls[sim.vm_names.index(vm)]
    for _ in range(count):
        time.sleep(rng.uniform(0.0, POLL_INTERVAL))
        run, back_in_pool = drive_event(world, vm, control)
        runs.append(run)
        if not back_in_pool:
            return  # the VM stays out of its pool: the lane's later events could not be drained


def drive_event(world: World, vm: str, control: str) -> tuple[EventRun, bool]:
    """One user Reboot of `vm`, from the notice until it is over and the VM is back in its pool."""
    sim = world.simulator
    event_id = new_event_id()
    key = event_id.lower()
    inject_user_reboot(control, vm, event_id)
    notice = wait_for(lambda: notices(sim.log_entries()).get(key), 5.0)
    if notice is None:
        return EventRun(event_id, vm, "the simulator never logged the event"), False
    approved = wait_for(lambda: accepted_approvals(sim.approvals()).get(key), EVENT_TIMEOUT)
    drained = wait_for(lambda: world.drained_at(vm, notice), EVENT_TIMEOUT)
    end_event(control, event_id)
    restored = wait_for(lambda: world.restored_at(vm, drained or notice), EVENT_TIMEOUT)
    missing = [what for what, seen in (("approved", approved), ("drained", drained)) if seen is None]
    error = f"not {' nor '.join(missing)} within {EVENT_TIMEOUT:g} s" if missing else None
    return EventRun(event_id, vm, error), restored is not None


def run_events(world: World, lanes: Sequence[str], count: int, seed: int = SEED) -> list[EventRun]:
    """`count` events spread over the lanes, the lanes side by side."""
    per_lane = -(-count // len(lanes))
    runs: list[EventRun] = []
    threads = [
        threading.Thread(
            target=drive_lane, args=(world, vm, per_lane, random.Random(seed + index), runs), name=f"lane-{vm}"
        )
        for index, vm in enumerate(lanes)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return runs


def stage_samples(world: World, runs: Sequence[EventRun]) -> dict[str, dict[str, float | None]]:
    """Milliseconds from the notice to each stage, by EventId, for the events that completed (the
    witnesses are read once: the Pub/Sub world's are pulled off its subscriptions)."""
    sim = world.simulator
    noticed = notices(sim.log_entries())
    approved = accepted_approvals(sim.approvals())
    seen = world.sightings()
    samples = {}
    for run in runs:
        if run.error is not None:
            continue
        key = run.event_id.lower()
        notice = noticed[key]
        moments = {**seen.stages(key), "drained": world.drained_at(run.vm, notice), "approved": approved.get(key)}
        samples[run.event_id] = {stage: after_notice_ms(notice, moments.get(stage)) for stage in STAGES}
    return samples


def world_figures(
    name: str, world: World, lanes: Sequence[str], count: int, drained_how: str, target: Target | None
) -> list[Figure]:
    # The first event of each VM runs apart and is reported apart: it meets cold paths (the
    # function's first invocations, each agent's first pull of its commands), not the steady state.
    first = run_events(world, lanes, len(lanes), seed=SEED - 1000)
    runs = run_events(world, lanes, count)
    by_event = stage_samples(world, [*first, *runs])
    samples = [by_event[run.event_id] for run in runs if run.event_id in by_event]
    failures = [run for run in runs if run.error is not None]
    rate_limited = sum(traffic["by_status"].get("429", 0) for traffic in world.simulator.traffic().values())
    common = f"{len(samples)} user Reboots over {len(lanes)} VMs, agents polling IMDS at {POLL_INTERVAL:g} s"
    if failures:
        common += f"; {len(failures)} event(s) failed: " + "; ".join(f"{r.vm}: {r.error}" for r in failures[:3])
    if rate_limited:
        common += f"; IMDS answered 429 to {rate_limited} request(s)"
    breakdown = where_the_time_goes(samples, STAGES)
    figures = latency_figures(
        f"end_to_end.{name}.drained",
        [value for sample in samples if (value := sample["drained"]) is not None],
        p99_target=target,
        note=f"notice → {drained_how}; {common}",
    )
    approved = [value for sample in samples if (value := sample["approved"]) is not None]
    approved_note = f"notice → the simulator accepted the StartRequests POST; {common}; medians: {breakdown}"
    if target is not None and approved and not target.met(percentile(approved, 0.99)):
        worst = max(samples, key=lambda sample: sample["approved"] or 0.0)
        approved_note += f". Missed; the slowest event: {describe_sample(worst, STAGES)} ms"
        detected, taken, done = worst["detected"], worst["approval_taken"], worst["approved"]
        if detected is not None and taken is not None and done is not None:
            approved_note += (
                f": {detected:.0f} ms of it until the agent's poll (once a second) saw the event, "
                f"{done - taken:.0f} ms in the agent's approval step (a fresh GET of the document, then the POST, "
                f"spaced by its 4 requests/s IMDS limiter)"
            )
    figures += latency_figures(f"end_to_end.{name}.approved", approved, p99_target=target, note=approved_note)
    for summary in summarise(samples, [stage for stage in STAGES if stage not in ("drained", "approved")]):
        for label, value in (("p50", summary.p50), ("p99", summary.p99)):
            figures.append(
                Figure(
                    f"end_to_end.{name}.stage.{summary.stage}.{label}",
                    value,
                    "ms",
                    note=f"notice → {STAGE_MEANING[summary.stage]}",
                    samples=summary.count,
                )
            )
    figures += agent_approval_figures(name, samples)
    figures += first_event_figures(name, [by_event[run.event_id] for run in first if run.event_id in by_event])
    return figures


def first_event_figures(name: str, samples: Sequence[dict[str, float | None]]) -> list[Figure]:
    """The slowest first event of a VM (one per VM, run before the measured ones, not among them)."""
    figures = []
    for stage in ("drained", "approved"):
        values = [value for sample in samples if (value := sample[stage]) is not None]
        if values:
            note = (
                f"notice → {stage}, the first event of each VM after the world started (not in the figures above); "
                f"medians: {where_the_time_goes(samples, STAGES)}"
            )
            figures.append(
                Figure(f"end_to_end.{name}.first_event.{stage}.max", max(values), "ms", None, note, len(values))
            )
    return figures


def agent_approval_figures(name: str, samples: Sequence[dict[str, float | None]]) -> list[Figure]:
    """The agent's own share of the approval: from beginning the approve command to IMDS accepting
    the POST — a fresh GET of the document, then the POST, both through the agent's IMDS limiter."""
    spans = [
        approved - taken
        for sample in samples
        if (approved := sample["approved"]) is not None and (taken := sample["approval_taken"]) is not None
    ]
    if not spans:
        return []
    note = (
        "the agent began the approve command (its ledger) → IMDS accepted the POST: a fresh GET of the document, "
        "then the POST, both through the agent's IMDS rate limiter (at most 4 in any 1.1 s)"
    )
    return [
        Figure(f"end_to_end.{name}.agent_approval.{label}", percentile(spans, fraction), "ms", None, note, len(spans))
        for label, fraction in (("p50", 0.50), ("p99", 0.99))
    ]


STAGE_MEANING = {
    "detected": "the agent saw the change (the envelope's time)",
    "published": "the bus took the envelope",
    "picked_up": "the function's invocation began (the time of its decision record)",
    "approval_sent": "the approve command was on the bus",
    "approval_taken": "the agent began the approve command (its command ledger)",
}


def embedded(context: BenchContext, count: int) -> list[Figure]:
    workdir = context.dir("end_to_end-embedded")
    with warnings_to(workdir / "warnings.log"):
        world = EmbeddedBench(workdir, EMBEDDED_LANES, lane_policy(EMBEDDED_LANES)).start()
        try:
            return world_figures(
                "embedded",
                world,
                EMBEDDED_LANES,
                count,
                "the local pool's removal (LocalPool.remove in the function host returned)",
                at_most(TARGET_MS),
            )
        finally:
            world.close()


def pubsub(context: BenchContext, count: int) -> list[Figure]:
    workdir = context.dir("end_to_end-pubsub")
    with warnings_to(workdir / "warnings.log"):
        world = PubSubBench(workdir, PUBSUB_LANES)
        try:
            world.start()
        except (DemoSetupError, TimeoutError, OSError) as exc:  # a peer missing or not starting
            world.close()
            return [
                Figure(f"end_to_end.pubsub.{stage}.p99", None, "ms", note=f"the Pub/Sub world did not start: {exc}")
                for stage in ("drained", "approved")
            ]
        try:
            figures = world_figures(
                "pubsub",
                world,
                PUBSUB_LANES,
                count,
                "the agent finished the drain command (its ledger), just after its /readyz turned unready",
                None,
            )
            gaps = [gap for vm in PUBSUB_LANES for gap in world.drain_gaps(vm)]
        finally:
            world.close()
    if gaps:
        slack = f"; the agent began each drain command a median {percentile(gaps, 0.5) * 1000:.1f} ms before"
        figures = [replace(f, note=f.note + slack) if ".drained." in f.name else f for f in figures]
    return figures


def run(context: BenchContext) -> list[Figure]:
    count = context.samples(10, 50)
    return [*embedded(context, count), *pubsub(context, count)]
