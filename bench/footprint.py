"""The agent's footprint per transport: steady resident memory, and CPU time per metadata poll
beside the Azure docs' own Python sample.

Each transport's agent runs as a child process (`mbridge agent --cloud azure --poll-interval 1`,
the docs' interval) against its own VM endpoint of one simulator with the rate limit off; all four
run side by side, and so does the docs' sample (bench/reference_poller.py) on an endpoint of its
own. Nothing changes in the metadata, so this is the agents' steady state: polling, and waiting on
their bus. The target is each agent's CPU per poll at most the sample's, measured over the same
window.

- Polls are counted exactly: the simulator's request count for the agent's VM (it is the only
  client of that endpoint).
- CPU: user + system time of the whole process (every thread) over the measured polls, after a
  warm-up; read at nanosecond resolution through the process's CPU clock, the same counter that
  /proc/<pid>/stat shows in clock ticks (given in the note as a cross-check).
- RSS: VmRSS from /proc/<pid>/status, sampled about once a second over the measured polls; the
  figure is the largest sample (MB = MiB, as the kernel counts).

Transports: `jsonl` (to a file), `local` (the embedded SQLite bus), `pubsub` against Google's
Pub/Sub emulator, and `servicebus` configured with a connection string for a namespace that
nobody serves (no Service Bus broker can run here): the agent loads the SDK, polls as usual, and
keeps retrying to open its commands receiver, each attempt refused at once.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import requests

from bench.agent_detection import start_reference, stop_reference
from bench.agent_probes import ImportRss, empty_pull, import_rss, start_empty_pull, start_import_rss
from bench.agent_process import AGENT_THREADS, AgentOptions, AgentProcess, describe_threads, start_agent, stop_all
from bench.context import BenchContext
from bench.proc import (
    CLOCK_TICKS,
    CpuReading,
    ProcessGoneError,
    ThreadCpu,
    cpu,
    rss_mb,
    rss_parts_mb,
    thread_cpu,
    thread_shares,
)
from bench.results import Figure, at_most
from mbridge.demo.emulators import PUBSUB, EmulatorMissingError, PeerProcess, launch_emulator, log_tail
from simulator import Simulator

POLL_INTERVAL = 1.0  # the docs' sample polls once a second
WARMUP_POLLS = 8  # imports done, connections and the first retries made: then the steady state starts
RSS_EVERY = 1.0  # seconds between VmRSS samples
TICK = 0.05  # how often the benchmark looks at its agents
CPU_RATIO_TARGET = 1.0  # an agent's CPU per poll against the docs' sample's, in the same window
RSS_TARGET_MB = {"jsonl": 30.0, "local": 30.0, "pubsub": 70.0, "servicebus": 45.0}
REFERENCE_VM = "footprint-reference"
TRANSPORTS = tuple(RSS_TARGET_MB)
PUBSUB_PROJECT = "mbridge-bench"
PROBE_VM = "footprint-probe"  # its own commands subscription, for the empty-pull probe
# How long one command pull of an idle agent waits (agent/loop.py asks for a minute, the Pub/Sub receiver
# holds a pull at most wire/transports/pubsub/receiving.py MAX_PULL_WAIT_SECONDS).
COMMAND_WAIT = 20.0
# Each may be held for the whole wait (the emulator holds an empty pull to its deadline): their sum
# stays within bench/agent_probes.py PROBE_TIMEOUT.
PROBE_PULLS = 2
EMULATOR_TIMEOUT = 60.0
# A namespace nobody serves: the SDK's development-emulator form speaks plain AMQP to
# localhost:5672, where nothing listens, so every connection attempt is refused at once.
UNSERVED_SERVICEBUS = (
    "Endpoint=sb://localhost/;SharedAccessKeyName=bench;SharedAccessKey=bm90LWEta2V5;UseDevelopmentEmulator=true"
)
SERVICEBUS_NOTE = (
    "transport servicebus with a connection string for a namespace nobody serves (the SDK's development form, "
    "plain AMQP to localhost:5672, refused): no Service Bus broker can run here; the agent loads the SDK, polls, "
    "and keeps retrying its commands receiver, so publishing is never exercised"
)


@dataclass
class Reference:
    """The docs' sample, measured from the first agent's measured poll to the last one's."""

    pid: int
    start: CpuReading | None = None
    polls_start: int = 0
    cpu_seconds: float = 0.0
    polls: int = 0

    @property
    def ms_per_poll(self) -> float | None:
        return self.cpu_seconds * 1000 / self.polls if self.polls else None


@dataclass
class Measured:
    """One transport's agent, from start to the end of its measured polls."""

    transport: str
    vm: str
    polls_wanted: int
    agent: AgentProcess | None = None
    failure: str | None = None  # why it was not measured
    polls_start: int = 0
    cpu_start: CpuReading | None = None
    threads_start: dict[int, ThreadCpu] = field(default_factory=dict)
    thread_ms_per_poll: dict[str, float] = field(default_factory=dict)
    polls: int = 0
    cpu_seconds: float = 0.0
    cpu_ticks: int = 0
    rss_samples: list[float] = field(default_factory=list)
    rss_parts: dict[str, float] = field(default_factory=dict)  # at the last sample: RssAnon, RssFile, RssShmem
    next_rss_at: float = 0.0
    done: bool = False

    @property
    def finished(self) -> bool:
        return self.done or self.failure is not None


def run(context: BenchContext) -> list[Figure]:
    directory = context.dir("footprint")
    polls_wanted = context.samples(30, 300)
    measured = [Measured(t, f"footprint-{t}", polls_wanted) for t in TRANSPORTS]
    pubsub = next(m for m in measured if m.transport == "pubsub")
    sim = Simulator(cloud="azure", vm_names=[*(m.vm for m in measured), REFERENCE_VM], speed=1.0).start()
    emulator: PeerProcess | None = None
    sample = None
    reference: Reference | None = None
    try:
        requests.post(f"{sim.base_urls[0]}/_sim/faults", json={"rate_limit": False}, timeout=10).raise_for_status()
        urls = dict(zip(sim.vm_names, sim.base_urls))
        try:
            emulator = launch_emulator(PUBSUB, directory)
        except EmulatorMissingError as exc:
            pubsub.failure = f"the Pub/Sub emulator is not available: {exc}"
        sample = start_reference(urls[REFERENCE_VM], directory / "reference.out")
        reference = Reference(sample.pid)
        for item in measured:
            if item.transport != "pubsub":
                item.agent = start_agent(item.transport, _options(item, urls[item.vm], directory), directory)
        deadline = time.monotonic() + polls_wanted * POLL_INTERVAL * 2 + EMULATOR_TIMEOUT
        while not all(m.finished for m in measured):
            if pubsub.agent is None and pubsub.failure is None and emulator is not None:
                _start_pubsub_when_ready(pubsub, emulator, urls[pubsub.vm], directory, deadline)
            traffic = sim.traffic()
            for item in measured:
                _step(item, traffic[item.vm]["total"])
            _follow_reference(reference, measured, traffic[REFERENCE_VM]["total"])
            if time.monotonic() > deadline:
                for item in measured:
                    if not item.finished:
                        item.failure = f"did not reach {polls_wanted} polls in time (had {_polls_so_far(item, sim)})"
            time.sleep(TICK)
        # The probes run once every agent is measured, so they take no CPU from a measured agent.
        import_probes = {transport: start_import_rss(transport) for transport in TRANSPORTS}
        pull_probe = None
        if pubsub.agent is not None and emulator is not None:
            pull_probe = start_empty_pull(emulator.host, PUBSUB_PROJECT, PROBE_VM, wait=COMMAND_WAIT, pulls=PROBE_PULLS)
        stop_all([m.agent for m in measured if m.agent is not None])
        imports = {transport: import_rss(probe) for transport, probe in import_probes.items()}
        pull_ms = empty_pull(pull_probe) if pull_probe is not None else None
    finally:
        stop_all([m.agent for m in measured if m.agent is not None])
        if sample is not None:
            stop_reference(sample)
        if emulator is not None:
            emulator.stop()
        sim.stop()
    jsonl = next(m for m in measured if m.transport == "jsonl")
    baseline = jsonl.cpu_seconds * 1000 / jsonl.polls if jsonl.done and jsonl.polls else None
    sample_ms = reference.ms_per_poll if reference is not None else None
    figures = [_reference_figure(reference)]
    for item in measured:
        figures += _figures(item, imports[item.transport], baseline, sample_ms, pull_ms)
    return figures


def _follow_reference(reference: Reference, measured: list[Measured], polls_now: int) -> None:
    """Start the sample's window with the first agent's measurement, end it with the last one's."""
    try:
        if reference.start is None:
            if any(m.cpu_start is not None for m in measured):
                reference.start, reference.polls_start = cpu(reference.pid), polls_now
            return
        if all(m.finished for m in measured) and not reference.polls:
            reference.cpu_seconds = cpu(reference.pid).seconds - reference.start.seconds
            reference.polls = polls_now - reference.polls_start
    except ProcessGoneError:
        reference.polls = 0


def _reference_figure(reference: Reference | None) -> Figure:
    value = reference.ms_per_poll if reference is not None else None
    note = (
        "the docs' Python sample (bench/reference_poller.py: requests once a second, no session) polling its own "
        "endpoint of the same simulator, user+system CPU of its process from the first agent's measured poll to "
        f"the last one's ({reference.polls if reference else 0} polls): the baseline of footprint.*.cpu_ratio"
    )
    return Figure("footprint.reference.cpu_per_poll", value, "ms/poll", None, note, reference.polls if reference else 0)


def _options(item: Measured, url: str, directory: Path) -> AgentOptions:
    extra: tuple[str, ...] = ()
    if item.transport == "jsonl":
        extra = ("--jsonl-path", str(directory / "jsonl-events.jsonl"))
    elif item.transport == "servicebus":
        extra = ("--servicebus-connection-string", UNSERVED_SERVICEBUS)
    elif item.transport == "pubsub":
        extra = ("--pubsub-project", PUBSUB_PROJECT)
    return AgentOptions(
        cloud="azure",
        metadata_url=url,
        vm_name=item.vm,
        transport=item.transport,
        poll_interval=POLL_INTERVAL,
        extra=extra,
    )


def _start_pubsub_when_ready(item: Measured, emulator: PeerProcess, url: str, directory: Path, deadline: float) -> None:
    """Once the emulator serves: its topics, the commands subscriptions (this VM's, the probe's), then the agent."""
    if not emulator.running:
        item.failure = f"the Pub/Sub emulator exited before it was ready: {log_tail(emulator.log_path)}"
        return
    if PUBSUB.ready_text not in _read(emulator.log_path):
        if time.monotonic() > deadline:
            item.failure = "the Pub/Sub emulator did not become ready in time"
        return
    base = f"http://{emulator.host}/v1/projects/{PUBSUB_PROJECT}"
    for topic in ("maintenance-events", "maintenance-commands"):
        requests.put(f"{base}/topics/{topic}", timeout=10).raise_for_status()
    subscription = {"topic": f"projects/{PUBSUB_PROJECT}/topics/maintenance-commands", "enableMessageOrdering": True}
    for vm in (item.vm, PROBE_VM):
        requests.put(
            f"{base}/subscriptions/maintenance-commands-{vm}", json=subscription, timeout=10
        ).raise_for_status()
    options = replace(_options(item, url, directory), env={PUBSUB.variable: emulator.host})
    item.agent = start_agent(item.transport, options, directory)


def _step(item: Measured, polls_now: int) -> None:
    """Move one agent along: warm-up, then measure until it made the polls wanted."""
    if item.finished or item.agent is None:
        return
    if not item.agent.running:
        item.failure = f"the agent exited with {item.agent.process.returncode}: {item.agent.log_tail(5)}"
        return
    try:
        if item.cpu_start is None:
            if polls_now >= WARMUP_POLLS:
                item.cpu_start, item.polls_start = cpu(item.agent.pid), polls_now
                item.threads_start = thread_cpu(item.agent.pid)
                item.next_rss_at = time.monotonic()
            return
        now = time.monotonic()
        if now >= item.next_rss_at:
            item.rss_samples.append(rss_mb(item.agent.pid))
            item.next_rss_at = now + RSS_EVERY
        if polls_now - item.polls_start >= item.polls_wanted:
            end, threads_end = cpu(item.agent.pid), thread_cpu(item.agent.pid)
            item.rss_samples.append(rss_mb(item.agent.pid))
            item.rss_parts = rss_parts_mb(item.agent.pid)
            item.polls = polls_now - item.polls_start
            item.cpu_seconds = end.seconds - item.cpu_start.seconds
            item.cpu_ticks = end.ticks - item.cpu_start.ticks
            shares = thread_shares(item.agent.pid, item.threads_start, threads_end, AGENT_THREADS)
            item.thread_ms_per_poll = {role: seconds * 1000 / item.polls for role, seconds in shares.items()}
            item.done = True
    except ProcessGoneError:
        item.failure = f"the agent exited while measured: {item.agent.log_tail(5)}"


def _polls_so_far(item: Measured, sim: Simulator) -> int:
    return sim.traffic()[item.vm]["total"] - item.polls_start


def _figures(
    item: Measured,
    imports: ImportRss | None,
    jsonl_cpu_ms: float | None,
    sample_ms: float | None,
    pull_ms: list[float] | None,
) -> list[Figure]:
    cpu_name, rss_name = f"footprint.{item.transport}.cpu_per_poll", f"footprint.{item.transport}.rss"
    ratio_name = f"footprint.{item.transport}.cpu_ratio"
    ratio_target, rss_target = at_most(CPU_RATIO_TARGET), at_most(RSS_TARGET_MB[item.transport])
    context_note = SERVICEBUS_NOTE if item.transport == "servicebus" else f"transport {item.transport}"
    if item.failure is not None or not item.polls:
        reason = item.failure or "no polls measured"
        return [
            Figure(cpu_name, None, "ms/poll", None, f"not measured: {reason}"),
            Figure(ratio_name, None, "ratio", ratio_target, f"not measured: {reason}"),
            Figure(rss_name, None, "MB", rss_target, f"not measured: {reason}"),
        ]
    cpu_ms = item.cpu_seconds * 1000 / item.polls
    cpu_notes = [
        f"{context_note}; user+system CPU over {item.polls} polls at --poll-interval {POLL_INTERVAL:g} s after "
        f"{WARMUP_POLLS} warm-up polls; /proc/<pid>/stat: {item.cpu_ticks} ticks "
        f"= {item.cpu_ticks * 1000 / CLOCK_TICKS / item.polls:.3f} ms/poll",
        describe_threads(item.thread_ms_per_poll, cpu_ms),
        *_cpu_causes(item.transport, cpu_ms, jsonl_cpu_ms, pull_ms),
    ]
    rss_notes = [
        f"{context_note}; max VmRSS of {len(item.rss_samples)} samples over the measured polls "
        f"(first {item.rss_samples[0]:.1f}, last {item.rss_samples[-1]:.1f} MB"
        + "".join(f"; {name} {mb:.1f}" for name, mb in item.rss_parts.items())
        + ")",
        imports.describe() if imports is not None else "the import probe failed",
    ]
    ratio = cpu_ms / sample_ms if sample_ms else None
    ratio_note = (
        f"ours {cpu_ms:.3f} / the docs' sample {sample_ms:.3f} ms/poll over the same window"
        if sample_ms
        else "the docs' sample was not measured"
    )
    return [
        Figure(cpu_name, cpu_ms, "ms/poll", None, "; ".join(cpu_notes), item.polls),
        Figure(ratio_name, ratio, "ratio", ratio_target, f"{ratio_note}; {context_note}", item.polls),
        Figure(rss_name, max(item.rss_samples), "MB", rss_target, "; ".join(rss_notes), len(item.rss_samples)),
    ]


def _cpu_causes(transport: str, cpu_ms: float, jsonl_cpu_ms: float | None, pull_ms: list[float] | None) -> list[str]:
    """What the transport adds to a poll, as measured in this run."""
    if transport == "jsonl" or jsonl_cpu_ms is None:
        return []
    causes = [
        f"jsonl, which has no command channel, took {jsonl_cpu_ms:.3f} ms/poll in the same run "
        f"(+{cpu_ms - jsonl_cpu_ms:.3f} here)"
    ]
    if transport == "pubsub" and pull_ms:
        median = statistics.median(pull_ms)
        causes.append(
            f"an empty command pull with the command loop's {COMMAND_WAIT:g} s wait came back after a median of "
            f"{median:.0f} ms from the emulator ({PROBE_PULLS} pulls), so the idle command loop pulls about "
            f"{60_000 / max(median, 1):.1f} times a minute"
        )
    return causes


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
