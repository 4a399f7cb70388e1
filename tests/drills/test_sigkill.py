"""Drill 2: `mbridge agent` killed with SIGKILL 20 times at random moments of a busy scenario.

The agent runs as a real process (tests/agent_runner.py's AgentProcess), publishing jsonl on its
standard output into a pipe of one page (4 KiB) that the drill reads slowly: a bus that takes its
time, so a kill can land while envelopes wait in the outbox or between a write and its mark.
Unlike the embedded bus, the stream keeps every duplicate, so "duplicates only as exact repeats"
can be checked (the event's bytes: its proof of identity is made by each life of the agent). After
each kill the agent is started again at once on the same state directory, as systemd would.

Builds on tests/contract/agent/test_process.py (six kills while 120 pre-added events are advanced by
hand, output through a slow pipe): here 20 kills at seeded random moments of a timed scenario in
which events appear, start, complete and are canceled on their own, also while the agent is down.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.state import AgentState
from simulator import Simulator
from simulator.scenarios import parse_scenario
from tests.agent_runner import AgentProcess
from tests.drills.conftest import (
    BusyScenario,
    busy_scenario,
    drill_seed,
    expected_id,
    fact_of,
    is_lifecycle_order,
    lifecycle_ordered,
    say,
    simulated_facts,
    wait_for_timeline_end,
)
from tests.waiting import wait_until
from wire.identity import AZURE_ATTESTED, AZURE_SESSION_KEY, AZURE_SIGNATURE, content_digest

pytestmark = [pytest.mark.drill, pytest.mark.timeout(60)]

VM = "vm-0"
SPEED = 60.0
KILLS = 20
UPTIME = (0.25, 1.2)  # real seconds an agent runs before it is killed
FIRST_POLL = 0.25  # real seconds from starting the process to its first metadata request (measured: 0.20-0.27)
PIPE_BYTES = 4096  # one page: a few envelopes fill it
READ_BYTES, READ_PAUSE = 512, 0.02  # the slow consumer: about 25 KB/s, some 20 envelopes a second
SEED = 20261122


@dataclass
class Stream:
    """Everything the agents wrote, in order, across all their lives."""

    data: bytearray = field(default_factory=bytearray)
    lock: threading.Lock = field(default_factory=threading.Lock)
    torn: int = 0  # lives whose output ended inside a line

    def envelopes(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines()]

    def lines(self) -> list[str]:
        """Complete lines so far (the reader may be in the middle of one)."""
        with self.lock:
            complete = bytes(self.data[: self.data.rfind(b"\n") + 1])
        return [line for line in complete.decode("utf-8").splitlines() if line.strip()]


@dataclass
class PipedAgent(AgentProcess):
    """AgentProcess with `--jsonl-path -` and standard output read slowly through a one-page pipe."""

    stream: Stream = field(default_factory=Stream)
    reader: threading.Thread | None = None

    def start(self) -> PipedAgent:
        process = self.launch(stdout=subprocess.PIPE)
        assert process.stdout is not None
        fd = process.stdout.fileno()
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self.reader = threading.Thread(target=self._drain, args=(fd,), daemon=True)
        self.reader.start()
        return self

    def _drain(self, fd: int) -> None:
        last = b"\n"
        while chunk := os.read(fd, READ_BYTES):
            with self.stream.lock:
                self.stream.data.extend(chunk)
            last = chunk[-1:]
            time.sleep(READ_PAUSE)
        if last != b"\n":
            self.stream.torn += 1
            with self.stream.lock:
                self.stream.data.extend(b"\n")

    def finish(self) -> None:
        """Wait for the reader to take everything this life wrote."""
        if self.reader is not None:
            self.reader.join(timeout=20)
            assert not self.reader.is_alive(), "the pipe was not drained within 20 s"


@pytest.fixture
def piped_agent(tmp_path: Path) -> Iterator[Callable[[list[str], Stream], PipedAgent]]:
    started: list[PipedAgent] = []

    def start(args: list[str], stream: Stream) -> PipedAgent:
        agent = PipedAgent(args, tmp_path / f"agent-{len(started)}.log", stream=stream).start()
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()


def test_twenty_sigkills_lose_nothing_and_duplicate_only_exact_repeats(
    tmp_path: Path, piped_agent: Callable[[list[str], Stream], PipedAgent]
) -> None:
    started = time.monotonic()
    seed = drill_seed(SEED)
    rng = random.Random(seed)
    # GIVEN 60 events for one VM in 8 bursts over 15 documented minutes, each Scheduled for 4-7
    # minutes and Started for 4-6 (at speed 60: 4-7 real seconds, far longer than an agent is down)
    plan = busy_scenario(
        rng, (VM,), events=60, first_at=30, last_at=900, notice=(240, 420), started_for=(240, 360), clusters=8
    )
    stream = Stream()
    state_dir = tmp_path / "state"
    with Simulator(vm_names=[VM], speed=SPEED, scenario=parse_scenario(plan.data, "sigkill")) as sim:
        sim_started = time.monotonic()
        args = ["--cloud", "azure", "--metadata-url", sim.base_urls[0], "--vm-name", VM, "--transport", "jsonl",
                "--jsonl-path", "-", "--state-dir", str(state_dir), "--listen", "off",
                "--poll-interval", "0.25"]  # fmt: skip

        # WHEN the agent is killed with SIGKILL 20 times, each time after a random uptime, and
        # started again at once on the same state directory
        changes = _planned_changes(plan, SPEED)
        left_pending: list[int] = []
        uptimes: list[float] = []
        blind: list[tuple[float, float]] = []
        aims = Counter[str]()
        for _ in range(KILLS):
            agent = piped_agent(args, stream)
            if blind:
                blind[-1] = (blind[-1][0], time.time() + FIRST_POLL)
            aim, kill_at = _kill_moment(rng, time.monotonic() - sim_started, changes)
            aims[aim] += 1
            uptimes.append(round(kill_at - (time.monotonic() - sim_started), 2))
            time.sleep(max(0.0, uptimes[-1]))
            agent.signal(signal.SIGKILL)
            blind.append((time.time(), 0.0))
            assert agent.wait() == -signal.SIGKILL
            left_pending.append(_pending(state_dir))
            agent.finish()

        # AND finally runs undisturbed until the scenario is over and everything is out
        survivor = piped_agent(args, stream)
        blind[-1] = (blind[-1][0], time.time() + FIRST_POLL)
        wait_for_timeline_end(sim, timeout=30)
        expected = set(simulated_facts(sim))
        wait_until(
            lambda: {fact_of(e) for e in stream.envelopes()} >= expected,
            20,
            lambda: f"{len(expected)} facts in the output (seed {seed}); log: {survivor.log()[-2000:]}",
        )
        survivor.signal(signal.SIGTERM)
        assert survivor.wait() == 0, survivor.log()[-2000:]
        survivor.finish()
        while_down = _changes_while_down(sim.log_entries(), blind)

    lines = stream.lines()
    envelopes = [json.loads(line) for line in lines]
    # THEN no life of the agent ended inside a line
    assert stream.torn == 0, f"{stream.torn} torn line(s) (seed {seed})"
    # ... every lifecycle step the simulator went through was published: 0 lost, nothing invented
    facts = {fact_of(e) for e in envelopes}
    assert facts == expected, f"lost {sorted(expected - facts)}, invented {sorted(facts - expected)} (seed {seed})"
    # ... each fact always under the id docs/contracts.md#deterministic-ids gives it
    ids_by_fact: dict[tuple[str, str], set[str]] = {}
    for envelope in envelopes:
        ids_by_fact.setdefault(fact_of(envelope), set()).add(envelope["id"])
    assert all(ids == {expected_id(fact)} for fact, ids in ids_by_fact.items()), f"unstable ids (seed {seed})"
    # ... a duplicate is always an exact repeat of the event, byte for byte once its proof of
    # identity is set aside (each life of the agent proves with a key of its own), and it is proven
    events_by_id: dict[str, set[str]] = {}
    for envelope in envelopes:
        events_by_id.setdefault(envelope["id"], set()).add(content_digest(envelope))
    assert all(len(variants) == 1 for variants in events_by_id.values()), f"a duplicate differs (seed {seed})"
    proven = {AZURE_ATTESTED, AZURE_SESSION_KEY, AZURE_SIGNATURE}
    assert all(proven <= set(e) for e in envelopes), f"an envelope without its proof (seed {seed})"
    # ... and first appearances follow the outbox, which kept the order the agents observed
    first_seen = list(dict.fromkeys(e["id"] for e in envelopes))
    assert first_seen == _outbox_ids(state_dir), f"publish order differs from the outbox (seed {seed})"
    for event_id, statuses in lifecycle_ordered(fact_of(e) for e in envelopes).items():
        assert is_lifecycle_order(list(dict.fromkeys(statuses))), f"{event_id}: {statuses} (seed {seed})"
    duplicates = sum(count - 1 for count in Counter(e["id"] for e in envelopes).values())
    say(
        "sigkill",
        seed=seed,
        kills=KILLS,
        events=len(plan.events),
        facts=len(expected),
        lines=len(lines),
        exact_duplicates=duplicates,
        kills_with_pending_outbox=sum(1 for count in left_pending if count),
        most_pending_at_a_kill=max(left_pending),
        changes_while_down=while_down,
        kill_aims=dict(aims),
        uptimes_s=f"{min(uptimes)}-{max(uptimes)}",
        duration_s=round(time.monotonic() - started, 1),
    )


def _planned_changes(plan: BusyScenario, speed: float) -> list[float]:
    """Real seconds after launch at which the scenario changes the document."""
    moments = set()
    for event in plan.events:
        moments.add(event.add_at)
        if event.cancel_at is not None:
            moments.add(event.cancel_at)
        elif event.no_notice:
            moments.add(event.add_at + event.started_for)
        else:
            moments.update({event.add_at + event.notice, event.add_at + event.notice + event.started_for})
    return sorted(moment / speed for moment in moments)


def _kill_moment(rng: random.Random, now: float, changes: list[float]) -> tuple[str, float]:
    """When to kill the agent just started at `now`: a third of the time at a random uptime, a third
    just before a change of the document (it happens while the agent is down), a third just after
    one (while the agent records and publishes it). Never before the agent could start polling."""
    earliest, latest = now + UPTIME[0], now + UPTIME[1]
    aim = rng.choice(("random", "before a change", "after a change"))
    if aim == "before a change":
        near = [moment - rng.uniform(0.0, 0.2) for moment in changes]
    elif aim == "after a change":
        near = [moment + rng.uniform(0.05, 0.5) for moment in changes]
    else:
        near = []
    near = [moment for moment in near if earliest <= moment <= latest]
    if not near:
        return "random", rng.uniform(earliest, latest)
    return aim, rng.choice(near)


def _changes_while_down(log: list[dict[str, object]], blind: list[tuple[float, float]]) -> int:
    """Simulator changes between a kill and the first poll of the agent started after it (Unix time)."""
    changes = [float(str(entry["unix_time"])) for entry in log if str(entry["message"]).startswith("event ")]
    return sum(1 for moment in changes if any(start <= moment <= end for start, end in blind))


def _pending(state_dir: Path) -> int:
    if not (state_dir / "agent.db").exists():
        return 0
    with sqlite3.connect(state_dir / "agent.db", timeout=5) as db:
        (count,) = db.execute("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL").fetchone()
    return int(count)


def _outbox_ids(state_dir: Path) -> list[str]:
    state = AgentState(state_dir / "agent.db")
    try:
        return [message.envelope_id for message in state.messages()]
    finally:
        state.close()
