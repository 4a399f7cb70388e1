"""Fleet: 10,000 agents, idle and under a wave of 1,000 maintenance events (`--only fleet`).

What an idle fleet costs the bus and the agents now that an idle agent holds no command path
(agent/engagement.py), and how the local function host and the agents carry a wave.

- Agents: virtual agents, many per process (bench/fleet_agents.py says which parts are the
  agent's own code and which are the harness's): 10,000 in `FULL.processes` processes (2,500
  each), 1,000 in two with `--quick`. They start with the 10 minutes an agent stays engaged after
  it starts already over (the engagement clock is moved past them), so every agent begins idle.
- Metadata: the simulator's own store and Azure API (simulator/store, simulator/azure_api.py),
  one store per `STORE_VMS` VMs, served over HTTP by one server of the bench's (a VM's base URL is
  `<server>/vm/<name>`). One store per few VMs because the store recomputes every VM's
  DocumentIncarnation on each change: 1,000 events added to one store of 10,000 VMs would take it
  minutes. The simulator's timeline is not run: an approved event stays Scheduled, so what is
  counted is notice → approval, not the start, end and restore that follow.
- Functions: the local function host (functions/local_app) on one LocalBus file, its SQLite store
  behind a counting proxy, the local load-balancer pool (a SQLite table standing in for the
  cloud's balancer) behind `RecordingBalancer`, the default policy with no drain period (a
  platform Reboot: drain, then approve at once), commands signed, reports taken on the reporter's
  name (`ReporterName`: no proofs of identity).
- Idle: `IDLE_WINDOW` seconds with every agent idle: the doorbells hung in the bus file (the
  local bus's receives: a receiver waiting for commands), sampled; the agents' idle turns (each
  reads its ledger twice and rests the transport once a minute) and their CPU time.
- Lone: `lone` single events one after another, each on its own VM. Wave: `wave` events, one VM
  each, added at once. notice → approval: from the simulator's log line that added the event
  (its clock, to the microsecond) to the simulator's record of the StartRequests POST that it
  accepted (milliseconds): both on the simulator's side, so the bench's own pace is not in it
  beyond the watching (the orchestrator compares DocumentIncarnations once a second, as an agent
  polls once a second).
- Per wave event: messages (the scheduled report, the approve command, its result: the local pool
  drains without a command), function invocations (reports and results the host processed), store calls (the
  StateStore and AuditLog ports), load-balancer writes (removals and restorations).
- Pub/Sub: bench/fleet_pubsub.py (the same agents on the emulator).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

from bench.context import BenchContext
from bench.fleet_agents import FleetSpec, Workers, start_workers
from bench.functions_fakes import RecordingBalancer
from bench.functions_witness import accepted_approvals, notices
from bench.functions_worlds import warnings_to
from bench.results import Figure, at_most, exactly, percentile
from functions.core.policy import Policy
from functions.local_app.balancer import LocalPool
from functions.local_app.host import READER, LocalFunctionHost
from functions.local_app.store import SqliteStore
from mbridge.demo.world import CommandKeys
from simulator.azure_api import AzureApi
from simulator.clock import Clock
from simulator.departures import Departures
from simulator.store import EventStore, MetadataRequest, SimLog, Timeline, parse_event_spec
from wire.envelope import decode
from wire.identity import ReporterName
from wire.model import CommandResult, MaintenanceEvent
from wire.transports.local import LocalBus

STORE_VMS = 50  # VMs per simulator store
POLL_SECONDS = 1.0  # how often the orchestrator looks for changed documents (an agent's poll)
SAMPLE_SECONDS = 0.25
LINGER_SECONDS = 600.0  # the agent's default (agent/engagement.py)
POLICY = Policy(drain_period_seconds=0.0)
POOL = "fleet"
HOUR = 3600.0
WRITES = frozenset(
    {"claim", "complete", "abandon", "reserve", "release", "record_drain", "forget_drain", "remember", "park"}
    | {"unpark", "append", "dead_letter"}
)
# What one event's notice → approval puts on the bus: its scheduled report, the approve command and
# its result (the drain is the balancer's: the local pool, no command).
CYCLE_MESSAGES = 3


@dataclass(frozen=True)
class FleetSize:
    agents: int
    wave: int
    lone: int
    processes: int
    threads: int  # turn threads per process
    idle_window: float  # seconds
    wave_timeout: float  # seconds


FULL = FleetSize(agents=10_000, wave=1_000, lone=5, processes=4, threads=8, idle_window=60.0, wave_timeout=300.0)
QUICK = FleetSize(agents=1_000, wave=100, lone=3, processes=2, threads=8, idle_window=20.0, wave_timeout=120.0)


def vm_names(count: int) -> list[str]:
    return [f"fleet-{index:05d}" for index in range(count)]


# ---- the simulator's stores behind one HTTP server


class MetadataShards:
    """The simulator's event store and Azure API, one per `STORE_VMS` VMs, served at /vm/<name>/."""

    def __init__(self, vms: Sequence[str]) -> None:
        self._of: dict[str, tuple[EventStore, AzureApi]] = {}
        self.stores: list[EventStore] = []
        self.logs: list[SimLog] = []
        for start in range(0, len(vms), STORE_VMS):
            names = tuple(vms[start : start + STORE_VMS])
            clock = Clock(1.0)
            cond = threading.Condition(threading.RLock())
            log = SimLog(clock, cond)
            timeline = Timeline(clock, cond)  # never run: an approved event stays Scheduled
            store = EventStore(clock, cond, timeline, log, names, Departures(cond, timeline, log, names, 1.0))
            api = AzureApi(store)
            self.stores.append(store)
            self.logs.append(log)
            self._of.update((vm, (store, api)) for vm in names)

    def add_reboot(self, vm: str) -> str:
        """A platform Reboot of `vm` (15 minutes of notice), seen by `vm` alone; its EventId."""
        event_id = str(uuid.uuid4()).upper()
        spec = parse_event_spec({"event_type": "Reboot", "event_id": event_id, "event_source": "Platform"})
        self._of[vm][0].add(spec, (vm,), (vm,))
        return event_id

    def answer(self, vm: str, request: MetadataRequest) -> tuple[int, bytes, str]:
        response = self._of[vm][1].handle(request)
        return response.status, response.body, response.content_type

    def served(self, vm: str) -> bool:
        return vm in self._of

    def incarnations(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for store in self.stores:
            found.update(store.incarnations())
        return found

    def notices(self) -> dict[str, float]:
        found: dict[str, float] = {}
        for log in self.logs:
            found.update(notices(cast(Any, log.entries())))
        return found

    def approved(self) -> dict[str, float]:
        """Lower-cased EventId → when the first approval naming it was accepted."""
        found: dict[str, float] = {}
        for store in self.stores:
            found.update(accepted_approvals(cast(Any, store.approvals())))
        return found

    def approval_posts(self) -> Counter[str]:
        """Lower-cased EventId → StartRequests POSTs naming it (any outcome)."""
        posts: Counter[str] = Counter()
        for store in self.stores:
            for record in store.approvals():
                posts.update(str(event_id).lower() for event_id in record["event_ids"])
        return posts


class _Handler(BaseHTTPRequestHandler):
    server: MetadataServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: object) -> None:
        return

    def _dispatch(self) -> None:
        parts = urlsplit(self.path)
        _, _, rest = parts.path.partition("/vm/")
        vm, _, path = rest.partition("/")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        shards = self.server.shards
        if not shards.served(vm):
            status, answer, content_type = 404, b'{"error": "no such VM"}', "application/json"
        else:
            request = MetadataRequest(
                method=self.command,
                path="/" + path,
                query={key: values[0] for key, values in parse_qs(parts.query, keep_blank_values=True).items()},
                headers={key.lower(): value for key, value in self.headers.items()},
                body=body,
                vm=vm,
            )
            status, answer, content_type = shards.answer(vm, request)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


class MetadataServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, shards: MetadataShards) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.shards = shards

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


# ---- counting what the functions do


class CountingStore:
    """The functions' SQLite store with every port call counted (store calls and their writes)."""

    def __init__(self, inner: SqliteStore) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not callable(attribute) or name.startswith("_"):
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            return attribute(*args, **kwargs)

        return counted

    def totals(self) -> tuple[int, int]:
        with self._lock:
            return sum(self.calls.values()), sum(count for name, count in self.calls.items() if name in WRITES)


# ---- watching and sampling


class Watcher:
    """Stands in for every agent's once-a-second read: tells the VMs whose DocumentIncarnation changed."""

    def __init__(self, shards: MetadataShards, workers: Workers) -> None:
        self._shards = shards
        self._workers = workers
        self._seen = shards.incarnations()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-watcher", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            now = self._shards.incarnations()
            changed = [vm for vm, incarnation in now.items() if self._seen.get(vm) != incarnation]
            self._seen = now
            if changed:
                self._workers.changed(changed)


@dataclass
class Samples:
    receives: list[int] = field(default_factory=list)  # receives held (doorbells in the bus file)
    paths: list[int] = field(default_factory=list)  # agents holding their command path


@contextmanager
def sampling(bus_path: Path, workers: Workers) -> Iterator[Samples]:
    """Every `SAMPLE_SECONDS`: the doorbells hung in the bus file and the agents with an open path."""
    samples = Samples()
    stop = threading.Event()

    def run() -> None:
        with closing(sqlite3.connect(f"file:{bus_path}?mode=ro", uri=True, timeout=5)) as db:
            while not stop.is_set():
                (count,) = db.execute("SELECT COUNT(*) FROM doorbells").fetchone()
                samples.receives.append(int(count))
                samples.paths.append(int(workers.stats()["path_open"]))
                stop.wait(SAMPLE_SECONDS)

    thread = threading.Thread(target=run, name="fleet-sampler", daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(10)


# ---- one run


@dataclass
class IdleCost:
    agents: int
    seconds: float
    receives_held: list[int]
    paths_open: list[int]
    counts: Counter[str]
    cpu: float  # CPU seconds of idle turns

    def per_agent_hour(self, amount: float) -> float:
        return amount / self.agents / (self.seconds / HOUR)

    @property
    def calls(self) -> int:
        """What an idle turn calls: the ledger (run_due, next_due_at), the transport's rest(), and receives."""
        return self.counts["ledger_calls"] + self.counts["rest_calls"] + self.counts["receive_calls"]


@dataclass
class WaveRun:
    events: dict[str, str]  # lower-cased EventId → VM
    notice: dict[str, float]
    approved: dict[str, float]
    posts: Counter[str]  # StartRequests POSTs per event
    receives_held: list[int]
    paths_open: list[int]
    messages: Counter[str]  # kind → count on the bus, for these events
    invocations: int
    store_calls: int
    store_writes: int
    lb_writes: int
    seconds: float
    problems: list[str]

    def latencies(self) -> list[float]:
        return [self.approved[key] - self.notice[key] for key in self.events if key in self.approved]


@dataclass
class LocalRun:
    size: FleetSize
    idle: IdleCost
    lone: WaveRun
    wave: WaveRun
    setup_seconds: float


def bus_messages(bus_path: Path, event_ids: set[str]) -> Counter[str]:
    """The messages on the bus about these events, by kind: reports by status, commands by type, results."""
    found: Counter[str] = Counter()
    with closing(sqlite3.connect(f"file:{bus_path}?mode=ro", uri=True, timeout=5)) as db:
        for body, attributes in db.execute("SELECT body, attributes FROM events"):
            if str(json.loads(attributes).get("event_id", "")).lower() not in event_ids:
                continue
            data = decode(bytes(body)).data
            if isinstance(data, MaintenanceEvent):
                found[f"report.{data.status.value}"] += 1
            elif isinstance(data, CommandResult):
                found["result"] += 1
        for (attributes,) in db.execute("SELECT attributes FROM commands"):
            parsed = json.loads(attributes)
            if str(parsed.get("event_id", "")).lower() in event_ids:
                found[f"command.{parsed.get('type')}"] += 1
    return found


def invocations_of(bus_path: Path, event_ids: set[str]) -> int:
    """Envelopes about these events that the host has taken off the bus (one invocation each)."""
    with closing(sqlite3.connect(f"file:{bus_path}?mode=ro", uri=True, timeout=5)) as db:
        row = db.execute("SELECT position FROM positions WHERE reader = ?", (READER,)).fetchone()
        position = 0 if row is None else int(row[0])
        rows = db.execute("SELECT attributes FROM events WHERE seq <= ?", (position,)).fetchall()
    return sum(1 for (attributes,) in rows if str(json.loads(attributes).get("event_id", "")).lower() in event_ids)


class LocalFleet:
    """Simulator stores, the function host on one bus file, and the virtual agents."""

    def __init__(self, workdir: Path, size: FleetSize, in_process: bool = False) -> None:
        self.size = size
        self.workdir = workdir
        self.vms = vm_names(size.agents)
        self.bus_path = workdir / "bus.db"
        self._stack = ExitStack()
        self._in_process = in_process

    def __enter__(self) -> LocalFleet:
        stack = self._stack
        try:
            stack.enter_context(warnings_to(self.workdir / "warnings.log"))
            self.shards = MetadataShards(self.vms)
            self.server = MetadataServer(self.shards)
            threading.Thread(target=self.server.serve_forever, name="fleet-metadata", daemon=True).start()
            stack.callback(self.server.server_close)
            stack.callback(self.server.shutdown)
            keys = CommandKeys.generate()
            bus = LocalBus(self.bus_path)
            stack.callback(bus.close)
            inner = SqliteStore(self.workdir / "functions.db")
            stack.callback(inner.close)
            self.store = CountingStore(inner)
            pool = LocalPool(self.workdir / "pool.db")
            stack.callback(pool.close)
            pool.add(POOL, self.vms)
            self.balancer = RecordingBalancer(pool)
            host = LocalFunctionHost(
                bus,
                cast(SqliteStore, self.store),
                self.balancer,
                POLICY,
                lambda: datetime.now(timezone.utc),
                verifier=ReporterName(),
                signer=keys.sign,
            )
            stop = threading.Event()
            thread = threading.Thread(target=host.run, args=(stop,), name="function-host", daemon=True)
            thread.start()
            stack.callback(thread.join, 10)
            stack.callback(stop.set)
            per = -(-len(self.vms) // self.size.processes)
            specs = [
                FleetSpec(
                    transport="local",
                    vms=tuple(self.vms[start : start + per]),
                    state_dir=str(self.workdir / "agents"),
                    metadata_url=self.server.url,
                    verify_key=keys.public,
                    linger_seconds=LINGER_SECONDS,
                    threads=self.size.threads,
                    bus_path=str(self.bus_path),
                    seed=start,
                )
                for start in range(0, len(self.vms), per)
            ]
            self.workers = start_workers(specs, in_process=self._in_process)
            stack.callback(self.workers.stop)
            # Agents that started more than the linger ago: every one begins idle.
            self.workers.each(("jump", LINGER_SECONDS + 1.0))
            self.workers.each(("start",))
            stack.enter_context(Watcher(self.shards, self.workers))
        except BaseException:
            stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def idle(self, seconds: float) -> IdleCost:
        before = self.workers.stats()
        with sampling(self.bus_path, self.workers) as samples:
            time.sleep(seconds)
        after = self.workers.stats()
        counts = Counter(after["counts"])
        counts.subtract(before["counts"])
        cpu = after["cpu"].get("idle", 0.0) - before["cpu"].get("idle", 0.0)
        return IdleCost(len(self.vms), seconds, samples.receives, samples.paths, counts, cpu)

    def events(self, vms: Sequence[str], timeout: float, one_at_a_time: bool = False) -> WaveRun:
        """Events on `vms` (all at once, or each after the previous one's approval); what they cost."""
        problems: list[str] = []
        calls_before, writes_before = self.store.totals()
        lb_before = len(self.balancer.removals()) + len(self.balancer.restorations())
        started = time.monotonic()
        events: dict[str, str] = {}
        with sampling(self.bus_path, self.workers) as samples:
            for vm in vms:
                events[self.shards.add_reboot(vm).lower()] = vm
                if one_at_a_time and not self._settled(set(list(events)[-1:]), started + timeout):
                    problems.append(f"the event of {vm} was not approved within {timeout:g} s")
            if not self._settled(set(events), started + timeout):
                problems.append(f"not every event was approved, answered and processed within {timeout:g} s")
        seconds = time.monotonic() - started
        calls_after, writes_after = self.store.totals()
        keys = set(events)
        return WaveRun(
            events=events,
            notice={key: value for key, value in self.shards.notices().items() if key in keys},
            approved={key: value for key, value in self.shards.approved().items() if key in keys},
            posts=Counter({key: count for key, count in self.shards.approval_posts().items() if key in keys}),
            receives_held=samples.receives,
            paths_open=samples.paths,
            messages=bus_messages(self.bus_path, keys),
            invocations=invocations_of(self.bus_path, keys),
            store_calls=calls_after - calls_before,
            store_writes=writes_after - writes_before,
            lb_writes=len(self.balancer.removals()) + len(self.balancer.restorations()) - lb_before,
            seconds=seconds,
            problems=problems,
        )

    def _settled(self, keys: set[str], deadline: float) -> bool:
        """Every event approved, its approve command answered, and the host caught up with the bus."""
        while time.monotonic() < deadline:
            approved = keys <= set(self.shards.approved())
            if approved and bus_messages(self.bus_path, keys)["result"] >= len(keys):
                with closing(sqlite3.connect(f"file:{self.bus_path}?mode=ro", uri=True, timeout=5)) as db:
                    (last,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
                    row = db.execute("SELECT position FROM positions WHERE reader = ?", (READER,)).fetchone()
                if row is not None and int(row[0]) >= int(last):
                    return True
            time.sleep(0.2)
        return False


def run_local(workdir: Path, size: FleetSize, in_process: bool = False) -> LocalRun:
    began = time.monotonic()
    with LocalFleet(workdir, size, in_process) as fleet:
        setup = time.monotonic() - began
        idle = fleet.idle(size.idle_window)
        lone = fleet.events(fleet.vms[: size.lone], size.wave_timeout, one_at_a_time=True)
        wave = fleet.events(fleet.vms[size.lone : size.lone + size.wave], size.wave_timeout)
    return LocalRun(size, idle, lone, wave, setup)


# ---- figures


def per_event(amount: float, run: WaveRun) -> float:
    return amount / max(1, len(run.events))


def latency_pair(name: str, run: WaveRun, setup: str) -> list[Figure]:
    samples = run.latencies()
    if not samples:
        return [Figure(f"{name}_p99_s", None, "s", None, f"no approval landed; {setup}", 0)]
    return [
        Figure(f"{name}_p50_s", percentile(samples, 0.50), "s", None, setup, len(samples)),
        Figure(f"{name}_p99_s", percentile(samples, 0.99), "s", None, setup, len(samples)),
    ]


def describe_wave(run: WaveRun) -> str:
    messages = ", ".join(f"{count} {kind}" for kind, count in sorted(run.messages.items()))
    text = (
        f"{len(run.events)} events, {len(run.approved)} approved, {sum(run.posts.values())} StartRequests POSTs; "
        f"on the bus: {messages or 'nothing'}; {run.seconds:.1f} s until every event was approved, answered and "
        "processed"
    )
    if run.problems:
        text += "; " + "; ".join(run.problems)
    return text


def local_figures(run: LocalRun) -> list[Figure]:
    size, idle, lone, wave = run.size, run.idle, run.lone, run.wave
    prefix = "fleet.local"
    setup = (
        f"{size.agents} virtual agents in {size.processes} processes on one LocalBus file, the local function host, "
        f"the simulator's stores ({STORE_VMS} VMs each)"
    )
    idle_setup = f"{setup}; every agent idle, {idle.seconds:g} s sampled every {SAMPLE_SECONDS:g} s"
    idle_turns = idle.counts["turns_idle"]
    wave_setup = f"{setup}; wave: {describe_wave(wave)}"
    lone_setup = f"{setup}; lone: {describe_wave(lone)}"
    one_approval = all(wave.posts.get(key, 0) == 1 for key in wave.events)
    cycle = (
        wave.messages["report.scheduled"]
        + wave.messages["command.drain"]
        + wave.messages["command.approve"]
        + wave.messages["result"]
    )
    lone_p99 = percentile(lone.latencies(), 0.99) if lone.latencies() else None
    wave_p99 = percentile(wave.latencies(), 0.99) if wave.latencies() else None
    ratio = None if lone_p99 is None or wave_p99 is None or lone_p99 <= 0 else wave_p99 / lone_p99
    return [
        Figure(
            f"{prefix}.idle_receives_held",
            float(max(idle.receives_held, default=0)),
            "count",
            exactly(0),
            f"most doorbells hung in the bus file at once (a receiver waiting for commands); {idle_setup}",
            len(idle.receives_held),
        ),
        Figure(
            f"{prefix}.idle_paths_open",
            float(max(idle.paths_open, default=0)),
            "count",
            exactly(0),
            f"most agents holding their command path at once; {idle_setup}",
            len(idle.paths_open),
        ),
        Figure(
            f"{prefix}.idle_receives_per_vm_hour",
            idle.per_agent_hour(idle.counts["receive_calls"]),
            "count",
            exactly(0),
            f"receive_commands calls of idle agents per VM-hour; {idle_setup}",
            idle_turns,
        ),
        Figure(
            f"{prefix}.idle_calls_per_vm_hour",
            idle.per_agent_hour(idle.calls),
            "count",
            None,
            f"what idle agents' command loops call per VM-hour: {idle.counts['ledger_calls']} ledger reads "
            f"(run_due, next_due_at), {idle.counts['rest_calls']} rest(), {idle.counts['receive_calls']} receives in "
            f"{idle_turns} idle turns; {idle_setup}",
            idle_turns,
        ),
        Figure(
            f"{prefix}.idle_cpu_s_per_vm_hour",
            idle.per_agent_hour(idle.cpu),
            "s",
            None,
            f"CPU seconds of idle agents' command-loop turns per VM-hour (thread time of each turn); {idle_setup}",
            idle_turns,
        ),
        Figure(
            f"{prefix}.wave_receives_held_peak",
            float(max(wave.receives_held, default=0)),
            "count",
            None,
            f"most doorbells hung at once during the wave ({len(lone.events)} lone-event VMs still engaged too); "
            f"{wave_setup}",
            len(wave.receives_held),
        ),
        Figure(
            f"{prefix}.wave_approvals",
            float(sum(1 for key in wave.events if key in wave.approved)),
            "count",
            exactly(len(wave.events)),
            f"wave events with an accepted approval ({'one' if one_approval else 'NOT one'} StartRequests POST "
            f"each); {wave_setup}",
            len(wave.events),
        ),
        Figure(
            f"{prefix}.messages_per_event",
            per_event(cycle, wave),
            "count",
            exactly(CYCLE_MESSAGES),
            f"bus messages per wave event from notice to approval: the scheduled report, the approve command, "
            f"its result (and a drain command where the balancer drains by one: none here); {wave_setup}",
            len(wave.events),
        ),
        Figure(
            f"{prefix}.invocations_per_event",
            per_event(wave.invocations, wave),
            "count",
            None,
            "envelopes of the wave's events the function host processed, per event (the report and the approval's "
            f"result); "
            f"{wave_setup}",
            len(wave.events),
        ),
        Figure(
            f"{prefix}.store_ops_per_event",
            per_event(wave.store_calls, wave),
            "count",
            None,
            "calls of the functions' StateStore and AuditLog ports per wave event, "
            f"{per_event(wave.store_writes, wave):.1f} of them writes (SQLite store); {wave_setup}",
            len(wave.events),
        ),
        Figure(
            f"{prefix}.lb_writes_per_event",
            per_event(wave.lb_writes, wave),
            "count",
            None,
            f"load-balancer removals and restorations per wave event (the local pool, a SQLite table standing in "
            f"for the cloud's balancer; restorations come after the event, which this run does not reach); "
            f"{wave_setup}",
            len(wave.events),
        ),
        *latency_pair(f"{prefix}.lone_notice_to_approval", lone, lone_setup),
        *latency_pair(f"{prefix}.wave_notice_to_approval", wave, wave_setup),
        Figure(
            f"{prefix}.wave_p99_over_lone_p99",
            ratio,
            "ratio",
            at_most(2.0),
            f"the wave's notice → approval p99 over the lone events' ({wave_p99} s over {lone_p99} s)",
            len(wave.events),
        ),
    ]


def run(context: BenchContext) -> list[Figure]:
    size = QUICK if context.quick else FULL
    local = run_local(context.dir("fleet-local"), size)
    figures = local_figures(local)
    from bench import fleet_pubsub

    figures.extend(fleet_pubsub.run(context, size))
    return figures
