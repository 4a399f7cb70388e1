"""Timed metadata changes and who saw them when: the runs behind `detection` and `reference`.

A change starts when the simulator applied it: its log entry's `unix_time`, written while the
simulator still holds the lock that keeps every client from seeing the change. It ends

- for the agent, when its envelope reached the embedded local bus (`published_at`, stamped by
  the bus as it takes the row), and
- for the docs' reference poller, when it first parsed a document that shows the change.

Both clocks are the machine's system clock, so the difference is the latency. Changes are spaced
so that each is seen by a poll of its own; on Azure the gaps are random and at least one poll
interval wide, so every change lands at a uniformly random phase of the poll cycle.

The Azure run drives our agent and the reference poller against one simulator at once (each on a
VM endpoint of its own, both seeing every event), so `detection` and `reference` share it: the
first section to ask runs it, the other reuses its figures.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench.agent_process import AGENT_THREADS, AgentOptions, AgentProcess, start_agent, wait_until
from bench.context import BenchContext
from bench.proc import CpuReading, cpu, thread_cpu, thread_shares
from bench.results import ROOT
from simulator import Simulator
from wire.transports.local import LocalBus

AGENT_VM = "bench-agent"
REFERENCE_VM = "bench-reference"
GCE_VM = "bench-gce"
AZURE_POLL_INTERVAL = 1.0
# The fast detection modes measured beside the default: the shortest interval the agent accepts
# (IMDS allows 5 requests a second) and one between.
FAST_POLL_INTERVALS = (0.5, 0.25)


def azure_gap(interval: float) -> tuple[float, float]:
    """Gaps between Azure changes: at least a poll period (interval + the request) so each change is
    seen by a poll of its own, spread over a whole period so the change falls at a random phase."""
    return (interval + 0.05, 2 * interval + 0.05)


AZURE_GAP = azure_gap(AZURE_POLL_INTERVAL)
# GCE long-polls answer at once; the gap only has to let the watcher re-read the key directly
# (or the simulator would skip the next warning) and start its next long-poll.
GCE_GAP = (0.1, 0.3)
ARRIVAL_TIMEOUT = 15.0
CONTROL_TIMEOUT = 10.0
SEED = 20240501  # a fixed seed: the same gaps in every run, so runs compare


# --------------------------------------------------------------------------- pure helpers


@dataclass(frozen=True)
class Change:
    """One change the simulator applied: `key` names what a client should see, `at` is its unix time."""

    key: tuple[str, str]  # Azure (event id lowercased, status); GCE (kind, status)
    at: float


@dataclass(frozen=True)
class Arrival:
    """One envelope on the bus: the same kind of key as its change, and when the bus took it."""

    key: tuple[str, str]
    at: float


@dataclass(frozen=True)
class Sighting:
    """One document the reference poller processed: when it parsed it, and the events in it."""

    at: float
    events: Mapping[str, str]  # event id lowercased -> EventStatus


def random_gaps(rng: random.Random, count: int, low: float, high: float) -> list[float]:
    """`count` waits drawn uniformly from [low, high)."""
    if not 0 <= low <= high:
        raise ValueError(f"need 0 <= low <= high, got {low}, {high}")
    return [rng.uniform(low, high) for _ in range(count)]


def match_arrivals(changes: Sequence[Change], arrivals: Sequence[Arrival]) -> tuple[list[float], list[Change]]:
    """Latency (ms) of each change to the first unused arrival with its key at or after it.

    Returns the latencies in change order and the changes no arrival answered. Arrivals that
    answer no change (say, a duplicate) are ignored.
    """
    used: set[int] = set()
    latencies: list[float] = []
    unmatched: list[Change] = []
    for change in changes:
        found = next(
            (
                index
                for index, arrival in enumerate(arrivals)
                if index not in used and arrival.key == change.key and arrival.at >= change.at
            ),
            None,
        )
        if found is None:
            unmatched.append(change)
            continue
        used.add(found)
        latencies.append((arrivals[found].at - change.at) * 1000)
    return latencies, unmatched


def shows(change: Change, sighting: Sighting) -> bool:
    """Whether an Azure document shows the change: the event with its new status, or gone."""
    event_id, status = change.key
    seen = sighting.events.get(event_id)
    if status == "completed":
        return seen is None
    return seen is not None and seen.lower() == status


def first_sightings(changes: Sequence[Change], sightings: Sequence[Sighting]) -> tuple[list[float], list[Change]]:
    """Latency (ms) of each change to the first processed document, parsed after it, that shows it."""
    latencies: list[float] = []
    unseen: list[Change] = []
    for change in changes:
        sighting = next((s for s in sightings if s.at >= change.at and shows(change, s)), None)
        if sighting is None:
            unseen.append(change)
        else:
            latencies.append((sighting.at - change.at) * 1000)
    return latencies, unseen


def parse_reference_output(lines: Iterable[str]) -> list[Sighting]:
    """The reference poller's document records (JSON lines); its other output is the sample's own log text."""
    sightings = []
    for line in lines:
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        events = {str(event_id).lower(): str(status) for event_id, status in record["events"]}
        sightings.append(Sighting(at=float(record["seen_at"]), events=events))
    return sightings


def envelope_arrival(body: bytes, published_at: float, *, cloud: str) -> Arrival | None:
    """The arrival an envelope stands for: Azure by (event id, status), GCE by (kind, status)."""
    envelope = json.loads(body)
    data = envelope.get("data") or {}
    if data.get("cloud") != cloud or "status" not in data:
        return None  # a command result, or another cloud's event
    first = str(data["event_id"]).lower() if cloud == "azure" else str(data["kind"])
    return Arrival(key=(first, str(data["status"])), at=published_at)


# --------------------------------------------------------------------------- the simulator side


class SimulatorDriver:
    """Changes through the simulator's control API, each with the moment its log entry records."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.url = sim.base_urls[0]
        self._session = requests.Session()
        self._log_seen = 0

    def post(self, path: str, body: object = None) -> dict[str, object]:
        response = self._session.post(f"{self.url}/_sim/{path}", json=body, timeout=CONTROL_TIMEOUT)
        if response.status_code not in (200, 201):
            raise RuntimeError(f"simulator refused POST /_sim/{path}: {response.status_code} {response.text}")
        answer: dict[str, object] = response.json()
        return answer

    def logged_at(self, matches: Callable[[str], bool]) -> float:
        """The unix time of the first new log entry whose message `matches` (the change just made)."""
        entries = self.sim.log_entries()
        for index in range(self._log_seen, len(entries)):
            if matches(str(entries[index]["message"])):
                self._log_seen = index + 1
                return float(str(entries[index]["unix_time"]))
        raise RuntimeError("the simulator logged no entry for the change just made")

    def traffic(self, vm: str) -> int:
        return self.sim.traffic()[vm]["total"]

    def close(self) -> None:
        self._session.close()


def azure_change(
    driver: SimulatorDriver, step: str, event_id: str | None, resources: Sequence[str]
) -> tuple[Change, str]:
    """One Azure change: `add` a Platform Reboot (Scheduled), `start` it, or `complete` it (removed).

    Returns the change and the EventId as the simulator spells it (the change key is lowercased).
    """
    if step == "add":
        body = {"event_type": "Reboot", "resources": list(resources), "audience": list(resources)}
        event_id = str(driver.post("events", body)["EventId"])
        added = f"event {event_id} added"
        return Change(key=(event_id.lower(), "scheduled"), at=driver.logged_at(lambda m: m.startswith(added))), event_id
    if event_id is None:
        raise ValueError(f"step {step!r} needs the EventId of an added event")
    driver.post(f"events/{event_id}/advance")
    if step == "start":
        started = f"event {event_id} Started"
        return Change(key=(event_id.lower(), "started"), at=driver.logged_at(lambda m: m.startswith(started))), event_id
    removed = f"event {event_id} removed (completed)"
    return Change(key=(event_id.lower(), "completed"), at=driver.logged_at(lambda m: m == removed)), event_id


# --------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class Watcher:
    """One client's figures over a run: latencies (ms), what it missed, its polls and CPU time."""

    latencies_ms: list[float]
    missed: int
    polls: int
    cpu_seconds: float
    cpu_ticks: int

    @property
    def cpu_ms_per_poll(self) -> float | None:
        return None if self.polls <= 0 else self.cpu_seconds * 1000 / self.polls


@dataclass(frozen=True)
class AzureRun:
    changes: int
    agent: Watcher
    reference: Watcher
    agent_threads: dict[str, float]  # the agent's CPU seconds by thread over the run
    seconds: float  # how long the measured window lasted
    interval: float  # the agent's poll interval
    idle_seconds: float  # the window before the changes, nothing changing: polls alone
    idle_cpu: tuple[float, float]  # CPU seconds of (the agent, the reference) over it
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class GceRun:
    changes: int
    agent: Watcher


# By the bench run's work directory and poll interval: one Azure run each per bench run, or the error
# that ended it.
_AZURE_RUNS: dict[tuple[str, float], AzureRun | Exception] = {}


def azure_run(context: BenchContext, interval: float = AZURE_POLL_INTERVAL) -> AzureRun:
    """The shared Azure run of this bench run at `interval`, made on first use; a failed run is not tried twice."""
    key = (str(context.workdir), interval)
    if key not in _AZURE_RUNS:
        try:
            _AZURE_RUNS[key] = _run_azure(context, context.samples(20, 201), interval)
        except Exception as error:
            _AZURE_RUNS[key] = error
            raise
    run = _AZURE_RUNS[key]
    if isinstance(run, Exception):
        raise RuntimeError(f"the Azure run shared with an earlier section failed: {run}") from run
    return run


def _run_azure(context: BenchContext, changes_wanted: int, interval: float) -> AzureRun:
    directory = context.dir(f"detection-azure-{interval:g}")
    rng = random.Random(SEED)
    sim = Simulator(cloud="azure", vm_names=[AGENT_VM, REFERENCE_VM], speed=1.0).start()
    sim.trust()  # the simulator makes its signing keys when first asked; a real metadata service has them
    driver = SimulatorDriver(sim)
    agent: AgentProcess | None = None
    reference: subprocess.Popen[bytes] | None = None
    reference_out = directory / "reference.out"
    try:
        driver.post("faults", {"rate_limit": False})
        agent_url, reference_url = sim.base_urls
        agent = start_agent(
            "agent",
            AgentOptions(cloud="azure", metadata_url=agent_url, vm_name=AGENT_VM, poll_interval=interval),
            directory,
        )
        reference = start_reference(reference_url, reference_out)
        wait_until(agent, lambda: driver.traffic(AGENT_VM) >= 2, "its first polls")
        running = reference  # narrowed for the lambda
        wait_until(
            agent, lambda: driver.traffic(REFERENCE_VM) >= 2 or running.poll() is not None, "the reference's polls"
        )
        if running.poll() is not None:
            output = reference_out.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise RuntimeError(f"the reference poller exited with {running.returncode}:\n{output}")
        idle_before, idle_began = (cpu(agent.pid), cpu(reference.pid)), time.monotonic()
        time.sleep(context.samples(10, 60))
        idle_after, idle_seconds = (cpu(agent.pid), cpu(reference.pid)), time.monotonic() - idle_began
        cpu_before = (cpu(agent.pid), cpu(reference.pid))
        threads_before = thread_cpu(agent.pid)
        polls_before = (driver.traffic(AGENT_VM), driver.traffic(REFERENCE_VM))
        began = time.monotonic()
        changes = _azure_changes(driver, rng, changes_wanted, azure_gap(interval))
        bus = LocalBus(agent.state_dir / "bus.db")
        try:
            arrivals = _wait_for_arrivals(bus, "azure", changes, agent)
        finally:
            bus.close()
        time.sleep(AZURE_POLL_INTERVAL + 0.1)  # the reference poller's last sighting
        cpu_after = (cpu(agent.pid), cpu(reference.pid))
        seconds = time.monotonic() - began
        agent_threads = thread_shares(agent.pid, threads_before, thread_cpu(agent.pid), AGENT_THREADS)
        polls_after = (driver.traffic(AGENT_VM), driver.traffic(REFERENCE_VM))
    finally:
        if reference is not None:
            stop_reference(reference)
        if agent is not None:
            agent.stop()
        driver.close()
        sim.stop()
    agent_latencies, agent_missed = match_arrivals(changes, arrivals)
    sightings = parse_reference_output(reference_out.read_text(encoding="utf-8").splitlines())
    reference_latencies, reference_missed = first_sightings(changes, sightings)
    notes = []
    if agent_missed:
        notes.append(f"the agent published nothing for {len(agent_missed)} change(s)")
    if reference_missed:
        notes.append(f"the reference poller never showed {len(reference_missed)} change(s)")
    return AzureRun(
        changes=len(changes),
        agent=_watcher(
            agent_latencies, len(agent_missed), polls_after[0] - polls_before[0], cpu_before[0], cpu_after[0]
        ),
        reference=_watcher(
            reference_latencies, len(reference_missed), polls_after[1] - polls_before[1], cpu_before[1], cpu_after[1]
        ),
        agent_threads=agent_threads,
        seconds=seconds,
        interval=interval,
        idle_seconds=idle_seconds,
        idle_cpu=(
            idle_after[0].seconds - idle_before[0].seconds,
            idle_after[1].seconds - idle_before[1].seconds,
        ),
        notes=notes,
    )


def _azure_changes(
    driver: SimulatorDriver, rng: random.Random, count: int, gap: tuple[float, float] = AZURE_GAP
) -> list[Change]:
    """Events through their lifecycle, one change per gap: added, Started, removed, the next event ..."""
    changes: list[Change] = []
    event_id: str | None = None
    steps = ("add", "start", "complete")
    for index, wait in enumerate(random_gaps(rng, count, *gap)):
        time.sleep(wait)
        change, event_id = azure_change(driver, steps[index % 3], event_id, [AGENT_VM, REFERENCE_VM])
        changes.append(change)
    return changes


def gce_run(context: BenchContext) -> GceRun:
    changes_wanted = context.samples(20, 200)
    directory = context.dir("detection-gce")
    rng = random.Random(SEED + 1)
    sim = Simulator(cloud="gce", vm_names=[GCE_VM], speed=1.0).start()
    sim.trust()  # the simulator makes its signing keys when first asked; a real metadata service has them
    driver = SimulatorDriver(sim)
    agent: AgentProcess | None = None
    try:
        agent = start_agent(
            "agent", AgentOptions(cloud="gce", metadata_url=sim.base_urls[0], vm_name=GCE_VM), directory
        )
        # instance/id, then a direct read of each of the three keys; their long-polls follow at once.
        wait_until(agent, lambda: driver.traffic(GCE_VM) >= 4, "its first reads")
        time.sleep(0.3)
        cpu_before, polls_before = cpu(agent.pid), driver.traffic(GCE_VM)
        changes = []
        values = ("MIGRATE_ON_HOST_MAINTENANCE", "NONE")
        for index, gap in enumerate(random_gaps(rng, changes_wanted, *GCE_GAP)):
            time.sleep(gap)
            value, previous = values[index % 2], values[(index + 1) % 2]
            answer = driver.post("gce", {"key": "maintenance-event", "value": value})
            if answer.get("shown") is not True:
                raise RuntimeError("the simulator skipped the warning: the agent had not re-read maintenance-event")
            logged = f"maintenance-event: {previous} -> {value}"
            at = driver.logged_at(lambda message: message == logged)  # noqa: B023 - called before the loop moves on
            changes.append(Change(key=("live_migrate", "scheduled" if value != "NONE" else "completed"), at=at))
        bus = LocalBus(agent.state_dir / "bus.db")
        try:
            arrivals = _wait_for_arrivals(bus, "gce", changes, agent)
        finally:
            bus.close()
        cpu_after, polls_after = cpu(agent.pid), driver.traffic(GCE_VM)
    finally:
        if agent is not None:
            agent.stop()
        driver.close()
        sim.stop()
    latencies, missed = match_arrivals(changes, arrivals)
    return GceRun(
        changes=len(changes),
        agent=_watcher(latencies, len(missed), polls_after - polls_before, cpu_before, cpu_after),
    )


def _wait_for_arrivals(bus: LocalBus, cloud: str, changes: Sequence[Change], agent: AgentProcess) -> list[Arrival]:
    """Every envelope on the bus once there is one for each change (or the timeout passed)."""
    deadline = time.monotonic() + ARRIVAL_TIMEOUT
    while True:
        arrivals = [
            arrival
            for event in bus.read_events(0, limit=100_000)
            if (arrival := envelope_arrival(event.body, event.published_at, cloud=cloud)) is not None
        ]
        _, unmatched = match_arrivals(changes, arrivals)
        if not unmatched or time.monotonic() > deadline:
            return arrivals
        agent.require_running()
        time.sleep(0.1)


def _watcher(latencies: list[float], missed: int, polls: int, before: CpuReading, after: CpuReading) -> Watcher:
    return Watcher(
        latencies_ms=latencies,
        missed=missed,
        polls=polls,
        cpu_seconds=after.seconds - before.seconds,
        cpu_ticks=after.ticks - before.ticks,
    )


# --------------------------------------------------------------------------- the reference poller process


def start_reference(base_url: str, output: Path) -> subprocess.Popen[bytes]:
    """bench/reference_poller.py as a script of its own: a process that imports what the docs' sample imports."""
    script = ROOT / "bench" / "reference_poller.py"
    with output.open("wb") as out:
        return subprocess.Popen(  # noqa: S603 - our own script
            [sys.executable, str(script), base_url],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def stop_reference(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
