"""Play the flows on a world, phase by phase, and check every expectation.

Each phase injects its flows at once, then watches until each flow reached its last stage (or
the phase's time is up), firing the flows' reactions (a cancel, the end of a GCE maintenance)
when their stage is seen. A short settle after the last phase lets a late duplicate action show
up before anything is checked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Protocol

import requests

from mbridge.demo.flows import Context, Flow, Forgery, Reaction, pools_after
from mbridge.demo.timeline import EventTimeline, Observer
from mbridge.demo.world import DemoWorld
from wire.envelope import encode, envelope_for_event

PHASE_TIMEOUT = 25.0
SETTLE_SECONDS = 1.0
POLL_SECONDS = 0.05
DEMO_BUDGET_SECONDS = 60.0


@dataclass(frozen=True)
class Verdict:
    flow: str  # flow key, or "demo" for the checks of the whole run
    title: str
    expectation: str
    failure: str | None  # None: it held


@dataclass
class Result:
    timelines: list[EventTimeline]
    verdicts: list[Verdict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(verdict.failure is None for verdict in self.verdicts)

    def first_failure(self) -> Verdict | None:
        return next((verdict for verdict in self.verdicts if verdict.failure is not None), None)


class Narration(Protocol):
    """Where the play tells what happens (report.LiveLines): each stage at its witness's time, what
    the play does itself, and `flush` as it polls, so that lines held for the witnesses' lag come out."""

    def stage(self, timeline: EventTimeline, stage: str, detail: str, when: datetime) -> None: ...

    def say(self, text: str, at: datetime | None = None) -> None: ...

    def flush(self, everything: bool = False) -> None: ...


@dataclass
class _Pending:
    flow: Flow
    reaction: Reaction
    due: float | None = None  # monotonic time once its stage was seen
    done: bool = False


@dataclass
class _PendingForgery:
    flow: Flow
    forgery: Forgery
    done: bool = False


def play(world: DemoWorld, flows: Sequence[Flow], context: Context, narration: Narration) -> Result:
    say = narration.say
    left_out = [flow for flow in flows if flow.agent_down is not None and not world.reads_central_feed(flow.cloud)]
    for flow in left_out:
        say(f"not played on this bus: {flow.title} (its functions read no {flow.cloud.value} control-plane feed)")
    flows = [flow for flow in flows if flow not in left_out]
    timelines = {flow.key: EventTimeline(flow.key, flow.cloud, flow.kind, flow.event_id) for flow in flows}
    observer = Observer(list(timelines.values()), narration.stage, world.sender_of)
    started = time.monotonic()
    for phase in sorted({flow.phase for flow in flows}):
        members = [flow for flow in flows if flow.phase == phase]
        # Between phases nothing earlier is still to come: what is held is printed before the next
        # phase begins (stopping an agent can take seconds, with nothing new to say meanwhile).
        narration.flush(everything=True)
        say(f"phase {phase}: {'; '.join(flow.title for flow in members)}")
        _run_phase(world, members, timelines, observer, narration)
        _revive_agents(world, members, say)
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        world.poll(observer)
        narration.flush()
        time.sleep(POLL_SECONDS)
    narration.flush(everything=True)
    result = Result(list(timelines.values()), seconds=time.monotonic() - started)
    for flow in flows:
        timeline = timelines[flow.key]
        for expectation in flow.expectations:
            result.verdicts.append(
                Verdict(flow.key, flow.title, expectation.text, expectation.check(timeline, context))
            )
    result.verdicts.extend(_whole_run_verdicts(world, pools_after(flows), result.seconds))
    return result


def _run_phase(
    world: DemoWorld,
    flows: Sequence[Flow],
    timelines: dict[str, EventTimeline],
    observer: Observer,
    narration: Narration,
) -> None:
    say = narration.say
    pending = [_Pending(flow, reaction) for flow in flows for reaction in flow.reactions]
    forgeries = [_PendingForgery(flow, forgery) for flow in flows for forgery in flow.forgeries]
    for flow in flows:
        if flow.agent_down is not None:
            say(f"{flow.key}: stopping the agent of {flow.agent_down}")
            narration.flush(everything=True)  # stopping takes seconds (a long-poll to end): say it first
            world.stop_agent(flow.agent_down)
            say(f"{flow.key}: the agent of {flow.agent_down} is stopped; nothing more comes from that VM")
        timeline = timelines[flow.key]
        timeline.injected_at = datetime.now(timezone.utc)
        narration.stage(timeline, "injected", flow.title, timeline.injected_at)
        for at_once in forgeries:
            if at_once.flow is flow and at_once.forgery.stage is None:
                _forge(world, at_once, say)
        if flow.inject is not None:
            path, body = flow.inject
            _post(world.control_url(flow.cloud) + path, body)
    deadline = time.monotonic() + PHASE_TIMEOUT
    while time.monotonic() < deadline:
        world.poll(observer)
        for item in pending:
            _react(world, item, timelines[item.flow.key], say)
        for forged in forgeries:
            if not forged.done and forged.forgery.stage in timelines[forged.flow.key].stages:
                _forge(world, forged, say)
        narration.flush()
        if all(all(stage in timelines[flow.key].stages for stage in flow.ends_with) for flow in flows):
            return
        time.sleep(POLL_SECONDS)
    late = [flow.key for flow in flows if not all(stage in timelines[flow.key].stages for stage in flow.ends_with)]
    say(f"phase time ({PHASE_TIMEOUT:g} s) is up; still waiting for: {', '.join(late)}")


def _revive_agents(world: DemoWorld, flows: Sequence[Flow], say: Callable[[str], None]) -> None:
    """The operator, told the agents were silent, starts them again: the VMs' own path is back."""
    for flow in flows:
        if flow.agent_down is not None:
            world.restart_agent(flow.agent_down)
            say(f"{flow.key}: the agent of {flow.agent_down} is started again (its operator was told it was silent)")


def _react(world: DemoWorld, item: _Pending, timeline: EventTimeline, say: Callable[[str], None]) -> None:
    if item.done or item.reaction.stage not in timeline.stages:
        return
    now = time.monotonic()
    if item.due is None:
        item.due = now + item.reaction.delay
    if now >= item.due:
        item.done = True
        say(f"{item.flow.key}: {item.reaction.says}")
        _post(world.control_url(item.flow.cloud) + item.reaction.path, item.reaction.body)


def _forge(world: DemoWorld, item: _PendingForgery, say: Callable[[str], None]) -> None:
    item.done = True
    forgery, flow = item.forgery, item.flow
    assert flow.event_id is not None, "a forgery names the event it forges"
    if forgery.says:
        say(f"{flow.key}: {forgery.says}")
    envelope = envelope_for_event(forgery.event(flow.event_id, flow.kind), datetime.now(timezone.utc))
    world.forge(forgery.by, encode(envelope))


def _whole_run_verdicts(world: DemoWorld, expected: dict[str, list[str]], seconds: float) -> list[Verdict]:
    pools = {name: sorted(vms) for name, vms in world.pools().items()}
    wrong = {name: vms for name, vms in pools.items() if vms != expected.get(name)}
    return [
        Verdict("demo", "the load-balancer pools", "back as they were, but for the VMs that are gone",
                f"pools now {wrong}, expected {expected}" if wrong else None),
        Verdict("demo", "the whole demo", f"done in under {DEMO_BUDGET_SECONDS:g} s",
                None if seconds < DEMO_BUDGET_SECONDS else f"took {seconds:.1f} s"),
    ]  # fmt: skip


def _post(url: str, body: object) -> None:
    response = requests.post(url, json=body, timeout=5)
    if response.status_code >= 400:
        raise RuntimeError(f"the simulator refused POST {url}: {response.status_code} {response.text}")
