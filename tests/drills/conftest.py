"""What the reliability drills share (docs/reliability.md).

- Seeds: every random choice of a drill comes from one seeded `random.Random`. The seed is printed
  (pytest shows it with the captured output when a drill fails); `MBRIDGE_DRILL_SEED=N` replays a run.
- Busy scenarios: many Azure events on a compressed clock, written as a simulator scenario, so the
  simulator itself moves every event through its lifecycle while the agents run.
- Facts: what the simulator says happened (its log) and what reached the bus, as (event, status) pairs.

The drills reuse the suite's own runners (tests/agent_runner.py) and peers (tests/peers*.py).
"""

from __future__ import annotations

import os
import random
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from simulator import Simulator
from wire.envelope import event_envelope_id
from wire.model import Cloud, EventStatus

Fact = tuple[str, str]  # (EventId, status)
LIFECYCLE = ("scheduled", "started", "completed", "canceled")


def drill_seed(default: int) -> int:
    """The seed of this run: `default`, or MBRIDGE_DRILL_SEED to replay or explore another one."""
    seed = int(os.environ.get("MBRIDGE_DRILL_SEED", default))
    print(f"drill seed {seed} (replay with MBRIDGE_DRILL_SEED={seed})")
    return seed


def say(name: str, **measured: object) -> None:
    """One line of measurements, for docs/reliability.md (run with -s to see it on success)."""
    values = " ".join(f"{key}={value}" for key, value in measured.items())
    print(f"DRILL {name}: {values}")


# ---------------------------------------------------------------------------------------- busy scenarios


@dataclass(frozen=True)
class PlannedEvent:
    """One event of a busy scenario, in documented seconds."""

    event_id: str
    event_type: str
    vm: str
    add_at: float
    notice: float
    started_for: float
    cancel_at: float | None = None  # removed while Scheduled
    no_notice: bool = False  # a hardware failure: appears already Started


@dataclass(frozen=True)
class BusyScenario:
    data: dict[str, Any]  # a scenario file's content (docs/simulator.md, "File format")
    events: tuple[PlannedEvent, ...]

    @property
    def last_change_at(self) -> float:
        """When the last planned event is gone (documented seconds)."""
        ends = []
        for event in self.events:
            if event.cancel_at is not None:
                ends.append(event.cancel_at)
            elif event.no_notice:
                ends.append(event.add_at + event.started_for)
            else:
                ends.append(event.add_at + event.notice + event.started_for)
        return max(ends)

    def vm_of(self, event_id: str) -> str:
        return next(event.vm for event in self.events if event.event_id == event_id)


EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Terminate", "Preempt")


def busy_scenario(
    rng: random.Random,
    vms: Sequence[str],
    *,
    events: int,
    first_at: float,
    last_at: float,
    notice: tuple[float, float],
    started_for: tuple[float, float],
    cancel_share: float = 0.2,
    no_notice_share: float = 0.1,
    clusters: int | None = None,
) -> BusyScenario:
    """`events` Azure events spread over [first_at, last_at] documented seconds, each seen only by its
    own VM (audience and resources: that VM), so every VM's facts are its own and order per VM can
    be checked on a shared bus. Some are canceled while Scheduled, some appear already Started.

    Notice and Started durations are drawn from the given ranges (documented seconds): the caller
    keeps them long enough, at its speed, for an agent to see every state. With `clusters`, events
    come in that many bursts that share their times, so each change of a burst publishes many
    envelopes at once.
    """
    bursts = [
        (round(rng.uniform(first_at, last_at), 1), round(rng.uniform(*notice)), round(rng.uniform(*started_for)))
        for _ in range(clusters or 0)
    ]
    planned = []
    steps: list[dict[str, Any]] = []
    for _ in range(events):
        vm_index = rng.randrange(len(vms))
        if bursts:
            add_at, notice_for, started = rng.choice(bursts)
        else:
            add_at = round(rng.uniform(first_at, last_at), 1)
            notice_for, started = round(rng.uniform(*notice)), round(rng.uniform(*started_for))
        event = PlannedEvent(
            event_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)).upper(),
            event_type=rng.choice(EVENT_TYPES),
            vm=vms[vm_index],
            add_at=add_at,
            notice=notice_for,
            started_for=started,
        )
        roll = rng.random()
        if roll < no_notice_share:
            event = replace(event, no_notice=True)
        elif roll < no_notice_share + cancel_share:
            event = replace(event, cancel_at=round(event.add_at + event.notice / 2, 1))
        planned.append(event)
        add: dict[str, Any] = {
            "event_type": event.event_type,
            "event_id": event.event_id,
            "resources": [f"${vm_index}"],
            "audience": [f"${vm_index}"],
            "started_for": event.started_for,
            "duration_seconds": 5 if event.event_type == "Freeze" else -1,
            # The drills count every step, completions included: a Preempt's or Terminate's VM keeps
            # answering, as if another VM of its set reported the end.
            "keep_serving": True,
        }
        if event.no_notice:
            add["status"] = "Started"
        else:
            add["notice"] = event.notice
        steps.append({"at": event.add_at, "add": add})
        if event.cancel_at is not None:
            steps.append({"at": event.cancel_at, "cancel": event.event_id})
    data = {"description": "a busy drill", "cloud": "azure", "vms": list(vms), "steps": steps}
    return BusyScenario(data=data, events=tuple(planned))


def wait_for_timeline_end(sim: Simulator, timeout: float) -> None:
    """Until the simulator has nothing left to do (every event started, completed or canceled)."""
    deadline = time.monotonic() + timeout
    while sim_timeline(sim):
        if time.monotonic() > deadline:
            raise AssertionError(f"the simulator's timeline did not end within {timeout} s: {sim_timeline(sim)[:3]}")
        time.sleep(0.2)


def sim_timeline(sim: Simulator) -> list[Any]:
    # Through the Python API: a VM whose port was closed (a deleted VM) takes its control API along.
    state: dict[str, Any] = sim.state()
    timeline: list[Any] = state["timeline"]
    return timeline


# ---------------------------------------------------------------------------------------- facts

_LOG_FACT = re.compile(
    r"^event (?P<id>\S+) (?:(?P<scheduled>added: )|(?P<no_notice>added already Started)|(?P<started>Started \()"
    r"|(?P<completed>removed \(completed\))|(?P<canceled>canceled \(removed while Scheduled\)))"
)


def simulated_facts(sim: Simulator) -> list[Fact]:
    """Every lifecycle step the simulator's events went through, in the order it logged them."""
    facts: list[Fact] = []
    for entry in sim.log_entries():
        match = _LOG_FACT.match(str(entry["message"]))
        if match is None:
            continue
        groups = match.groupdict()
        if groups["scheduled"]:
            status = "scheduled"
        elif groups["no_notice"] or groups["started"]:
            status = "started"
        elif groups["completed"]:
            status = "completed"
        else:
            status = "canceled"
        facts.append((match["id"], status))
    return facts


def fact_of(envelope: Mapping[str, Any]) -> Fact:
    return str(envelope["data"]["event_id"]), str(envelope["data"]["status"])


def expected_id(fact: Fact, cloud: Cloud = Cloud.AZURE) -> str:
    """The envelope id docs/contracts.md#deterministic-ids gives a fact: SHA-256 of cloud|event_id|status."""
    return event_envelope_id(cloud, fact[0], EventStatus(fact[1]))


def lifecycle_ordered(facts: Iterable[Fact]) -> dict[str, list[str]]:
    """Statuses per event, in the order given."""
    by_event: dict[str, list[str]] = {}
    for event_id, status in facts:
        by_event.setdefault(event_id, []).append(status)
    return by_event


def is_lifecycle_order(statuses: Sequence[str]) -> bool:
    """scheduled → started → completed (or canceled), each at most once, in that order."""
    ranks = [LIFECYCLE.index(status) for status in statuses]
    return ranks == sorted(set(ranks)) and not ("completed" in statuses and "canceled" in statuses)
