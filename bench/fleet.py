"""Fleet: 10,000 agents, idle, under a wave of 1,000 maintenance events and a burst of 1,000 (`--only fleet`).

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
  minutes. The stores' timelines are not run: an approved event stays Scheduled, so what is
  counted is notice → approval, not the start, end and restore that follow.
- Functions: the local function host (functions/local_app) on one LocalBus file, its SQLite store
  behind a counting proxy, the local load-balancer pool (a SQLite table standing in for the
  cloud's balancer) behind `RecordingBalancer`, the default policy with no drain period (a
  platform Reboot: drain, then approve at once), commands signed, reports taken on the reporter's
  name (`ReporterName`: no proofs of identity).
- Idle: `IDLE_WINDOW` seconds with every agent idle: the doorbells hung in the bus file (the
  local bus's receives: a receiver waiting for commands), sampled; the agents' idle turns (each
  reads its ledger twice and rests the transport once a minute) and their CPU time.
- Lone: `lone` single events one after another, each on its own VM, each added once the previous
  one is approved.
- Wave: `wave` events, one VM each, arriving evenly over `wave_seconds` (1,000 over 100 s: 10/s,
  9 times the rate of wave A at 10,000 VMs, 1,000 events over 900 s: docs/scale.md). The arrivals
  are put on a simulator `Timeline` at fixed moments and run by its thread (open loop: an event
  arrives on time whatever has become of the earlier ones). The product's requirement is on this
  wave: notice → approval p99 at most twice a lone event's.
- Burst: `burst` events added at one instant. The agents' own work (on a fleet each on its own
  VM's CPU), the simulator's server and the one local host then all queue on this machine's cores:
  reported, without a target, as what that queue costs here, not as the product's latency.
- notice → approval: from the simulator's log line that added the event (its clock, to the
  microsecond) to the simulator's record of the StartRequests POST that it accepted
  (milliseconds): both on the simulator's side, so the bench's own pace is not in it beyond the
  watching (the orchestrator compares DocumentIncarnations once a second, as an agent polls once
  a second).
- Exactly once: per wave and burst event, one accepted approval (one POST), exactly its scheduled
  report, approve command and result on the bus, and every command settled; agent turns that
  failed are reported by kind and logged with a traceback (`agent-failures.log` in the run's
  directory).
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
from collections.abc import Callable, Iterator, Sequence
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
from wire.envelope import COMMAND_TYPE_PREFIX, decode
from wire.identity import ReporterName
from wire.model import CommandResult, MaintenanceEvent
from wire.transports.local import LocalBus

STORE_VMS = 50  # VMs per simulator store
POLL_SECONDS = 1.0  # how often the orchestrator looks for changed documents (an agent's poll)
SAMPLE_SECONDS = 0.25
LINGER_SECONDS = 600.0  # the agent's default (agent/engagement.py)
# The VMs' pools here are read directly, no probe between: out at once (readiness_probe_seconds 0).
POLICY = Policy(drain_period_seconds=0.0, readiness_probe_seconds=0.0)
POOL = "fleet"
HOUR = 3600.0
WRITES = frozenset(
    {"claim", "complete", "abandon", "reserve", "release", "record_drain", "forget_drain", "remember", "park"}
    | {"unpark", "append", "dead_letter"}
)
# What one event's notice → approval puts on the bus: its scheduled report, the approve command and
# its result (the drain is the balancer's: the local pool, no command).
CYCLE = Counter({"report.scheduled": 1, "command.approve": 1, "result": 1})
CYCLE_MESSAGES = sum(CYCLE.values())


@dataclass(frozen=True)
class FleetSize:
    agents: int
    wave: int  # events of the measured wave, arriving evenly over `wave_seconds`
    wave_seconds: float
    burst: int  # events added at one instant
    lone: int
    processes: int
    threads: int  # turn threads per process
    idle_window: float  # seconds
    wave_timeout: float  # seconds, after the last event arrived

    @property
    def wave_rate(self) -> float:
        """Events per second of the measured wave."""
        return self.wave / self.wave_seconds


# Wave A at 10,000 VMs (docs/scale.md): 10 % of the fleet over 15 minutes, 1,000 events in 900 s (1.1/s).
# The measured wave is 1,000 events in 100 s (10/s), 9 times that rate; `--quick` keeps the rate at
# 100 events in 20 s (5/s).
FULL = FleetSize(
    agents=10_000,
    wave=1_000,
    wave_seconds=100.0,
    burst=1_000,
    lone=5,
    processes=4,
    threads=8,
    idle_window=60.0,
    wave_timeout=300.0,
)
QUICK = FleetSize(
    agents=1_000,
    wave=100,
    wave_seconds=20.0,
    burst=100,
    lone=3,
    processes=2,
    threads=8,
    idle_window=20.0,
    wave_timeout=120.0,
)
WAVE_A_RATE = 1_000 / 900.0  # events/s of wave A at 10,000 VMs (docs/scale.md)


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
    how: str  # how the events arrived: "one at a time", "arriving evenly over <s> s", "at once"
    events: dict[str, str]  # lower-cased EventId → VM, in the order they arrived
    notice: dict[str, float]
    approved: dict[str, float]
    posts: Counter[str]  # StartRequests POSTs per event
    receives_held: list[int]
    paths_open: list[int]
    messages: dict[str, Counter[str]]  # lower-cased EventId → kind → count on the bus
    unsettled: int  # commands of these events still open on the bus at the end
    invocations: int
    store_calls: int
    store_writes: int
    lb_writes: int
    seconds: float
    problems: list[str]
    failures: dict[str, int] = field(default_factory=dict)  # turns of agents that raised, by kind

    def latencies(self) -> list[float]:
        return [self.approved[key] - self.notice[key] for key in self.events if key in self.approved]

    def kinds(self) -> Counter[str]:
        """Every message of these events on the bus, by kind."""
        total: Counter[str] = Counter()
        for counts in self.messages.values():
            total.update(counts)
        return total

    def exact_cycles(self) -> int:
        """Events whose notice → approval put exactly one scheduled report, one approve command and
        one result on the bus (and nothing else)."""
        return sum(1 for key in self.events if self.messages.get(key, Counter()) == CYCLE)

    def arrival_span(self) -> float:
        """Seconds from the first event's notice to the last one's."""
        moments = [self.notice[key] for key in self.events if key in self.notice]
        return max(moments) - min(moments) if moments else 0.0


@dataclass
class LocalRun:
    size: FleetSize
    idle: IdleCost
    lone: WaveRun
    wave: WaveRun
    burst: WaveRun
    setup_seconds: float


def _event_of(attributes: str) -> str:
    return str(json.loads(attributes).get("event_id", "")).lower()


def bus_messages(bus_path: Path, event_ids: set[str]) -> dict[str, Counter[str]]:
    """The messages on the bus about these events, per event and kind: reports by status, commands
    by type, results."""
    found: dict[str, Counter[str]] = {}
    with closing(sqlite3.connect(f"file:{bus_path}?mode=ro", uri=True, timeout=5)) as db:
        for body, attributes in db.execute("SELECT body, attributes FROM events"):
            key = _event_of(attributes)
            if key not in event_ids:
                continue
            data = decode(bytes(body)).data
            if isinstance(data, MaintenanceEvent):
                found.setdefault(key, Counter())[f"report.{data.status.value}"] += 1
            elif isinstance(data, CommandResult):
                found.setdefault(key, Counter())["result"] += 1
        for (attributes,) in db.execute("SELECT attributes FROM commands"):
            key = _event_of(attributes)
            if key in event_ids:
                found.setdefault(key, Counter())[f"command.{json.loads(attributes).get('type')}"] += 1
    return found


def unsettled_commands(bus_path: Path, event_ids: set[str]) -> int:
    """Commands of these events the bus still holds unsettled."""
    with closing(sqlite3.connect(f"file:{bus_path}?mode=ro", uri=True, timeout=5)) as db:
        rows = db.execute("SELECT attributes FROM commands WHERE settled_at IS NULL").fetchall()
    return sum(1 for (attributes,) in rows if _event_of(attributes) in event_ids)


def results_on_bus(bus_path: Path, event_ids: set[str]) -> set[str]:
    """The events with a command result on the bus (read from the messages' type attribute)."""
    with closing(sqlite3.connect(f"file:{bus_path}?mode=ro", uri=True, timeout=5)) as db:
        rows = db.execute("SELECT attributes FROM events").fetchall()
    found: set[str] = set()
    for (attributes,) in rows:
        parsed = json.loads(attributes)
        key = str(parsed.get("event_id", "")).lower()
        if key in event_ids and str(parsed.get("type", "")).startswith(COMMAND_TYPE_PREFIX):
            found.add(key)
    return found


def invocations_of(bus_path: Path, event_ids: set[str]) -> int:
    """Envelopes about these events that the host has taken off the bus (one invocation each)."""
    with closing(sqlite3.connect(f"file:{bus_path}?mode=ro", uri=True, timeout=5)) as db:
        row = db.execute("SELECT position FROM positions WHERE reader = ?", (READER,)).fetchone()
        position = 0 if row is None else int(row[0])
        rows = db.execute("SELECT attributes FROM events WHERE seq <= ?", (position,)).fetchall()
    return sum(1 for (attributes,) in rows if _event_of(attributes) in event_ids)


class Arrivals:
    """Events put on a simulator `Timeline` (the schedule a scenario's add steps go on) at fixed
    moments, and run by its own thread: the i-th of n at i * seconds / n. Open loop: an event
    arrives on time whatever has become of the earlier ones."""

    def __init__(self, shards: MetadataShards, vms: Sequence[str], seconds: float) -> None:
        self._shards = shards
        self._count = len(vms)
        self.events: dict[str, str] = {}
        self._done = threading.Event()
        clock = Clock(1.0)
        self._timeline = Timeline(clock, threading.Condition(threading.RLock()))
        start = clock.sim_now()
        step = seconds / max(1, len(vms))
        for index, vm in enumerate(vms):
            self._timeline.schedule(f"arrival-{index}", start + index * step, f"a Reboot of {vm}", self._adder(vm))
        self._thread = threading.Thread(target=self._timeline.run_forever, name="fleet-arrivals", daemon=True)

    def _adder(self, vm: str) -> Callable[[float], None]:
        def add(_at: float) -> None:
            self.events[self._shards.add_reboot(vm).lower()] = vm
            if len(self.events) >= self._count:
                self._done.set()

        return add

    def run(self, timeout: float) -> bool:
        """Run the schedule; whether every event arrived within `timeout` seconds."""
        self._thread.start()
        try:
            return self._done.wait(timeout)
        finally:
            self._timeline.stop()
            self._thread.join(10)


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

    def lone(self, vms: Sequence[str], timeout: float) -> WaveRun:
        """One event after another, each added once the previous one is approved."""

        def arrive(events: dict[str, str], problems: list[str], deadline: float) -> None:
            for vm in vms:
                key = self.shards.add_reboot(vm).lower()
                events[key] = vm
                if not self._settled({key}, deadline):
                    problems.append(f"the event of {vm} was not approved within {timeout:g} s")

        return self._measure("one at a time", arrive, timeout)

    def wave(self, vms: Sequence[str], seconds: float, timeout: float) -> WaveRun:
        """`len(vms)` events arriving evenly over `seconds` on the simulator's schedule."""

        def arrive(events: dict[str, str], problems: list[str], deadline: float) -> None:
            arrivals = Arrivals(self.shards, vms, seconds)
            if not arrivals.run(seconds + timeout):
                problems.append(f"only {len(arrivals.events)} of {len(vms)} events arrived")
            events.update(arrivals.events)

        return self._measure(f"arriving evenly over {seconds:g} s", arrive, seconds + timeout)

    def burst(self, vms: Sequence[str], timeout: float) -> WaveRun:
        """`len(vms)` events added at one instant."""

        def arrive(events: dict[str, str], problems: list[str], deadline: float) -> None:
            for vm in vms:
                events[self.shards.add_reboot(vm).lower()] = vm

        return self._measure("at once", arrive, timeout)

    def _measure(self, how: str, arrive: Callable[[dict[str, str], list[str], float], None], timeout: float) -> WaveRun:
        """Events made to arrive by `arrive`, then everything they put in motion waited for; what they cost."""
        problems: list[str] = []
        calls_before, writes_before = self.store.totals()
        lb_before = len(self.balancer.removals()) + len(self.balancer.restorations())
        failures_before = Counter(self.workers.stats()["failures"])
        started = time.monotonic()
        events: dict[str, str] = {}
        with sampling(self.bus_path, self.workers) as samples:
            arrive(events, problems, started + timeout)
            if not self._settled(set(events), started + timeout):
                problems.append(f"not every event was approved, answered, settled and processed within {timeout:g} s")
        seconds = time.monotonic() - started
        calls_after, writes_after = self.store.totals()
        stats = self.workers.stats()
        failures = Counter(stats["failures"])
        failures.subtract(failures_before)
        failed = {kind: count for kind, count in failures.items() if count > 0}
        for kind in failed:
            self._log_failure(how, kind, failed[kind], stats["tracebacks"].get(kind, ""))
        keys = set(events)
        return WaveRun(
            how=how,
            events=events,
            notice={key: value for key, value in self.shards.notices().items() if key in keys},
            approved={key: value for key, value in self.shards.approved().items() if key in keys},
            posts=Counter({key: count for key, count in self.shards.approval_posts().items() if key in keys}),
            receives_held=samples.receives,
            paths_open=samples.paths,
            messages=bus_messages(self.bus_path, keys),
            unsettled=unsettled_commands(self.bus_path, keys),
            invocations=invocations_of(self.bus_path, keys),
            store_calls=calls_after - calls_before,
            store_writes=writes_after - writes_before,
            lb_writes=len(self.balancer.removals()) + len(self.balancer.restorations()) - lb_before,
            seconds=seconds,
            problems=problems,
            failures=failed,
        )

    def _log_failure(self, how: str, kind: str, count: int, trace: str) -> None:
        """A kind of failed agent turn, with its first traceback, in `<workdir>/agent-failures.log`."""
        with (self.workdir / "agent-failures.log").open("a", encoding="utf-8") as log:
            log.write(f"events {how}: {count} turns failed: {kind}\n{trace}\n")

    def _settled(self, keys: set[str], deadline: float) -> bool:
        """Every event approved, its approve command answered and settled, and the host caught up
        with the bus."""
        while time.monotonic() < deadline:
            if (
                keys <= set(self.shards.approved())
                and results_on_bus(self.bus_path, keys) == keys
                and unsettled_commands(self.bus_path, keys) == 0
            ):
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
        vms = iter(fleet.vms)
        lone = fleet.lone([next(vms) for _ in range(size.lone)], size.wave_timeout)
        wave = fleet.wave([next(vms) for _ in range(size.wave)], size.wave_seconds, size.wave_timeout)
        burst = fleet.burst([next(vms) for _ in range(size.burst)], size.wave_timeout)
    return LocalRun(size, idle, lone, wave, burst, setup)


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


def p99(run: WaveRun) -> float | None:
    samples = run.latencies()
    return percentile(samples, 0.99) if samples else None


def over(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def describe_wave(run: WaveRun) -> str:
    messages = ", ".join(f"{count} {kind}" for kind, count in sorted(run.kinds().items()))
    text = (
        f"{len(run.events)} events {run.how} (first to last notice {run.arrival_span():.1f} s), "
        f"{len(run.approved)} approved, {sum(run.posts.values())} StartRequests POSTs; on the bus: "
        f"{messages or 'nothing'}, {run.exact_cycles()} events with exactly a scheduled report, an approve command "
        f"and a result, {run.unsettled} commands unsettled; {run.seconds:.1f} s until every event was approved, "
        "answered, settled and processed"
    )
    if run.failures:
        text += "; agent turns that failed: " + "; ".join(f"{count} x {kind}" for kind, count in run.failures.items())
    if run.problems:
        text += "; " + "; ".join(run.problems)
    return text


def cycle_figures(prefix: str, run: WaveRun, setup: str) -> list[Figure]:
    """Whether each event's notice → approval did exactly what it should: one accepted approval
    (one POST), the scheduled report, the approve command and its result on the bus, every command
    settled."""
    one_post = all(run.posts.get(key, 0) == 1 for key in run.events)
    return [
        Figure(
            f"{prefix}_approvals",
            float(sum(1 for key in run.events if key in run.approved)),
            "count",
            exactly(len(run.events)),
            f"events with an accepted approval ({'one' if one_post else 'NOT one'} StartRequests POST each); {setup}",
            len(run.events),
        ),
        Figure(
            f"{prefix}_commands_unsettled",
            float(run.unsettled),
            "count",
            exactly(0),
            f"commands of these events still unsettled on the bus once every result was in; {setup}",
            len(run.events),
        ),
    ]


def local_figures(run: LocalRun) -> list[Figure]:
    size, idle, lone, wave, burst = run.size, run.idle, run.lone, run.wave, run.burst
    prefix = "fleet.local"
    setup = (
        f"{size.agents} virtual agents in {size.processes} processes on one LocalBus file, the local function host, "
        f"the simulator's stores ({STORE_VMS} VMs each)"
    )
    idle_setup = f"{setup}; every agent idle, {idle.seconds:g} s sampled every {SAMPLE_SECONDS:g} s"
    idle_turns = idle.counts["turns_idle"]
    rate = (
        f"{size.wave} events arriving evenly over {size.wave_seconds:g} s ({size.wave_rate:g}/s, "
        f"{size.wave_rate / WAVE_A_RATE:.1f} times the rate of wave A at 10,000 VMs: 1,000 events over 900 s, "
        "docs/scale.md), "
        "put on a simulator Timeline at fixed moments (open loop)"
    )
    wave_setup = f"{setup}; wave of {rate}: {describe_wave(wave)}"
    lone_setup = f"{setup}; lone: {describe_wave(lone)}"
    burst_setup = f"{setup}; burst: {describe_wave(burst)}"
    queue = (
        f"all {len(burst.events)} events added at one instant: the {len(burst.events)} agents' own work (reading "
        "the document, publishing the report, verifying the command, POSTing the approval), the simulator's one "
        "HTTP server and the one local function host all queue on this machine's 2 cores, where on a fleet each "
        "agent works on its own VM's CPU. The queue is this machine's, not the product's latency on a fleet: no "
        "target"
    )
    lone_p99, wave_p99, burst_p99 = p99(lone), p99(wave), p99(burst)
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
            f"{prefix}.wave_arrivals_per_s",
            over(float(len(wave.events) - 1), wave.arrival_span()),
            "events/s",
            None,
            f"the wave's arrival rate as the simulator's log shows it (events after the first over first to last "
            f"notice); scheduled: {rate}",
            len(wave.events),
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
        *cycle_figures(f"{prefix}.wave", wave, wave_setup),
        Figure(
            f"{prefix}.messages_per_event",
            per_event(sum(wave.kinds().values()), wave),
            "count",
            exactly(CYCLE_MESSAGES),
            f"bus messages per wave event from notice to approval: the scheduled report, the approve command, "
            f"its result (and a drain command where the balancer drains by one: none here); "
            f"{wave.exact_cycles()} of {len(wave.events)} events exactly so; {wave_setup}",
            len(wave.events),
        ),
        Figure(
            f"{prefix}.invocations_per_event",
            per_event(wave.invocations, wave),
            "count",
            None,
            "envelopes of the wave's events the function host processed, per event (the report and the approval's "
            f"result); {wave_setup}",
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
            over(wave_p99, lone_p99),
            "ratio",
            at_most(2.0),
            f"the wave's notice → approval p99 over the lone events' ({wave_p99} s over {lone_p99} s); wave of {rate}",
            len(wave.events),
        ),
        *cycle_figures(f"{prefix}.burst", burst, burst_setup),
        Figure(
            f"{prefix}.burst_messages_per_event",
            per_event(sum(burst.kinds().values()), burst),
            "count",
            exactly(CYCLE_MESSAGES),
            f"bus messages per burst event from notice to approval (the scheduled report, the approve command, its "
            f"result); {burst.exact_cycles()} of {len(burst.events)} events exactly so; {burst_setup}",
            len(burst.events),
        ),
        *latency_pair(f"{prefix}.burst_notice_to_approval", burst, f"{queue}; {burst_setup}"),
        Figure(
            f"{prefix}.burst_p99_over_lone_p99",
            over(burst_p99, lone_p99),
            "ratio",
            None,
            f"the burst's notice → approval p99 over the lone events' ({burst_p99} s over {lone_p99} s); {queue}",
            len(burst.events),
        ),
    ]


def run(context: BenchContext) -> list[Figure]:
    size = QUICK if context.quick else FULL
    local = run_local(context.dir("fleet-local"), size)
    figures = local_figures(local)
    from bench import fleet_pubsub

    figures.extend(fleet_pubsub.run(context, size))
    return figures
