"""Virtual agents for the fleet benchmark (bench/fleet.py): many agents' watching and command paths
in one process, turned by a small scheduler instead of each agent's own threads.

What is the agent's own code, used as agent/loop.py and agent/main.py use it:

- the metadata client (`AzureImdsClient`: its HTTP, its parsing of the Scheduled Events document),
  the Azure tracker (what changed since the last document), `names_this_vm` (`--forward own`),
  `event_message` / `result_message` / `with_message_id` (agent/messages.py), and the open events
  the command loop follows (`agent.loop._next_pending`);
- the transport: `LocalTransport` or `PubSubTransport`, its `publish`, its
  `commands.receive_commands` and its `rest()`;
- the command path: the real `CommandProcessor` with its SQLite ledger (one file per agent), the
  real `Readiness`, commands verified with the functions' signing key, approvals POSTed by the
  metadata client; each command settled after its result is recorded;
- `Engagement`, asked as the command loop asks it (`Agent._command_path_wanted`): an agent receives
  while it is engaged, and rests the transport (`rest()`) and waits `COMMAND_IDLE_WAIT_SECONDS`
  (or until an event of its VM) while it is not.

What is the harness's:

- the turns: a thread pool runs one turn of an agent's command loop at a time (run what is due,
  ask `Engagement`, then rest or receive), and a selector loop decides when the next turn is: on
  the local bus it waits on the agent's doorbell (the UDP socket `receive_commands` hangs; the
  receive is made with no wait of its own, and the selector waits in its place), on Pub/Sub a pool
  thread makes the pull itself (it blocks up to the wait, so the pulls outstanding at once are
  bounded by the pool);
- the watching: the real agent reads its document every second; here the orchestrator compares
  the simulator's DocumentIncarnations once a second and tells the VMs whose document changed,
  which then read it with their real client. Idle VMs read nothing (their polls are not what this
  benchmark is about);
- results are published straight from the command turn (`result_message` → `publish`) instead
  of through the agent's outbox and publisher thread; no proof of identity is attached (the
  function host takes the reporter's name: `ReporterName`);
- the engagement clock: monotonic time plus an offset the orchestrator moves forward, so the 10
  minutes an agent stays engaged after it starts pass at once;
- on the local bus, the agents of a process share one `LocalBus` (one SQLite connection): with one
  each, 10,000 agents would hold 10,000 more descriptors than a process may open here;
- counting: turns, calls and CPU time (per thread) of idle and engaged turns, and receives held
  (doorbells waited on, subscribers open, pulls outstanding), counted where the agent meets its
  transport;
- failures: a turn that raises is counted by the exception's kind, with the first traceback of
  each kind (bench/fleet.py reports them and logs them to `agent-failures.log`), and taken again
  `RETRY_SECONDS` later: a VM whose document read failed reads it again, and a command whose
  handling or result publish failed is given back to the receiver, as the agent's loop gives back
  a command it failed on (the real agent's results go through its outbox, which retries).
"""

from __future__ import annotations

import contextlib
import heapq
import os
import random
import selectors
import socket
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

from agent.commands import CommandLedger, CommandProcessor
from agent.engagement import Engagement
from agent.health import Readiness
from agent.loop import COMMAND_IDLE_WAIT_SECONDS, _next_pending
from agent.messages import event_message, names_this_vm, result_message, with_message_id
from agent.sources.azure.client import AzureImdsClient, AzureObservation
from agent.sources.azure.tracker import AzureTracker
from agent.timing import SystemClock
from wire.errors import RetryableError
from wire.model import Cloud, CommandResult
from wire.signing import load_public_key
from wire.transports.base import AgentTransport, OutboundMessage

# A Pub/Sub agent's pull waits at most this long here (the agent's own wait is up to a minute, and
# MAX_PULL_WAIT_SECONDS caps it at 20 s): a pool thread is held that long per pull.
PUBSUB_PULL_WAIT = 2.0
RETRY_SECONDS = 1.0  # a turn that failed (bus unavailable) is taken again this much later


@dataclass(frozen=True)
class FleetSpec:
    """What one process of virtual agents runs (picklable: it crosses to a spawned process)."""

    transport: str  # "local" or "pubsub"
    vms: tuple[str, ...]
    state_dir: str
    metadata_url: str  # the orchestrator's metadata server; a VM's base URL is <url>/vm/<name>
    verify_key: str  # PEM of the key the functions sign commands with
    linger_seconds: float
    threads: int
    bus_path: str = ""  # local
    pubsub_project: str = ""
    pubsub_events_topic: str = ""
    pubsub_commands_topics: tuple[tuple[str, str], ...] = ()  # (vm, its commands topic)
    pubsub_emulator: str = ""
    seed: int = 0


class FleetClock:
    """The engagement clock: monotonic time plus an offset the orchestrator moves forward."""

    def __init__(self) -> None:
        self._offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self._offset

    def jump(self, seconds: float) -> None:
        self._offset += seconds


class Tally:
    """Thread-safe counts, CPU seconds and the failures of turns (each kind once, with its traceback)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.cpu: dict[str, float] = {}
        self.failures: Counter[str] = Counter()  # "<Type>: <message>" → how many turns failed so
        self.tracebacks: dict[str, str] = {}  # the first traceback of each

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self.counts[name] += amount

    def spend(self, name: str, seconds: float) -> None:
        with self._lock:
            self.cpu[name] = self.cpu.get(name, 0.0) + seconds

    def fail(self, vm: str, error: BaseException) -> None:
        """A turn of `vm`'s agent raised `error`: counted by its kind, its first traceback kept."""
        kind = "".join(traceback.format_exception_only(type(error), error)).strip()
        with self._lock:
            self.counts["turn_failures"] += 1
            self.failures[kind] += 1
            if kind not in self.tracebacks:
                self.tracebacks[kind] = f"{vm}: " + "".join(traceback.format_exception(error))

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "counts": dict(self.counts),
                "cpu": dict(self.cpu),
                "failures": dict(self.failures),
                "tracebacks": dict(self.tracebacks),
            }


class CountingSubscriber:
    """A Pub/Sub subscriber client that counts its pulls and whether it is open (the transport edge)."""

    def __init__(self, inner: Any, tally: Tally) -> None:
        self._inner = inner
        self._tally = tally
        tally.add("subscribers_opened")

    def pull(self, *args: Any, **kwargs: Any) -> Any:
        self._tally.add("pulls")
        self._tally.add("pulls_outstanding")
        try:
            return self._inner.pull(*args, **kwargs)
        finally:
            self._tally.add("pulls_outstanding", -1)

    def close(self) -> None:
        self._tally.add("subscribers_closed")
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class VirtualAgent:
    """One VM's agent: its tracker, command processor, engagement and transport."""

    def __init__(
        self,
        vm: str,
        transport: AgentTransport,
        imds: AzureImdsClient,
        processor: CommandProcessor,
        readiness: Readiness,
        engagement: Engagement,
        tally: Tally,
    ) -> None:
        self.vm = vm
        self.transport = transport
        self.imds = imds
        self.processor = processor
        self.readiness = readiness
        self.engagement = engagement
        self.tracker = AzureTracker(vm, None)
        self.tracker.follow_approvals(processor.approved_event_ids)
        self._tally = tally
        self.pending: dict[str, dict[str, str]] = {}
        self.last_read: float | None = None
        self.path_open = False  # Agent.command_path_open
        self.changed = False  # the orchestrator said this VM's document changed
        self.busy = False  # a turn of this agent is running
        self.again = False  # something happened during that turn: take another at once
        self.registered: socket.socket | None = None  # the doorbell the selector waits on

    # ---- watching (Agent.handle_observation, without the outbox)

    def read_document(self) -> None:
        document = self.imds.fetch_document()
        now = time.time()
        observed_at = datetime.now(timezone.utc)
        lag = 1.0 if self.last_read is None else now - self.last_read
        self.last_read = now
        applied = self.tracker.apply(AzureObservation(document, observed_at, lag))
        for event in applied.events:
            if names_this_vm(event):
                self._publish(event_message(event, observed_at))
        self.pending = _next_pending(self.pending, applied.events)
        self.tracker.commit(applied)
        self._tally.add("documents_read")

    # ---- one turn of Agent._command_loop

    def wanted(self) -> bool:
        """Run what is due, then whether the command path is wanted (Agent._command_path_wanted)."""
        self._record(self.processor.run_due())
        engaged = self.engagement.engaged(
            open_events=bool(self.pending),
            drained=self.readiness.drained,
            work_pending=self.processor.next_due_at() is not None,
        )
        self._tally.add("ledger_calls", 2)  # run_due and next_due_at read the ledger
        return engaged

    def rest(self) -> None:
        self.path_open = False
        self.transport.rest()
        self._tally.add("rest_calls")

    def receive(self, wait: float) -> None:
        """One receive and what it brought: handled, the results recorded, then settled."""
        self.path_open = True
        receiver = self.transport.commands
        assert receiver is not None
        self._tally.add("receive_calls")
        for command in receiver.receive_commands(wait):
            try:
                result = self.processor.handle(command.body)
                if result is not None:
                    self._record([result])
            except RetryableError:
                self._tally.add("commands_given_back")
                if command.abandon is not None:
                    command.abandon()
                continue
            except Exception:
                # Given back unsettled, as the agent's loop gives back a command it failed on; here
                # that includes a result the bus refused (the agent records it in its outbox, which
                # retries): the replay is answered with the result the ledger stored.
                self._tally.add("commands_given_back")
                if command.abandon is not None:
                    command.abandon()
                raise
            command.settle()
            self._tally.add("commands_settled")

    def command_wait(self) -> float:
        """Agent._command_wait."""
        wait = min(COMMAND_IDLE_WAIT_SECONDS, max(1.0, self.engagement.seconds_left()))
        due = self.processor.next_due_at()
        if due is None:
            return wait
        return max(0.0, min(wait, (due - datetime.now(timezone.utc)).total_seconds()))

    def _record(self, results: Sequence[CommandResult]) -> None:
        if not results:
            return
        now = datetime.now(timezone.utc)
        for result in results:
            self._publish(result_message(result, Cloud.AZURE, self.vm, now))
            self._tally.add("results_published")
        self.processor.mark_reported(results)

    def _publish(self, message: OutboundMessage) -> None:
        self.transport.publish(with_message_id(message))
        self._tally.add("published")


def doorbell_of(transport: AgentTransport) -> socket.socket | None:
    """The UDP socket a local agent's receiver waits on, once hung (LocalCommandReceiver keeps it
    private: a `fileno()` on the receiver is the seam this would use)."""
    receiver = transport.commands
    doorbell = getattr(receiver, "_doorbell", None)
    return doorbell if isinstance(doorbell, socket.socket) else None


class Fleet:
    """The virtual agents of one process and the scheduler that turns them."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.clock = FleetClock()
        self.tally = Tally()
        self._system = SystemClock()
        self._closers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._timers: list[tuple[float, int, str]] = []
        self._sequence = 0
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(spec.threads, thread_name_prefix="fleet-turn")
        self._verify_key = load_public_key(spec.verify_key.encode("ascii"))
        self.agents = {vm: self._agent(vm) for vm in spec.vms}
        self._loop = threading.Thread(target=self._run, name="fleet-scheduler", daemon=True)

    def _transports(self) -> Callable[[str], AgentTransport]:
        if self.spec.transport == "local":
            from wire.transports.local import LocalBus, LocalTransport

            bus = LocalBus(Path(self.spec.bus_path))
            self._closers.append(bus.close)
            return lambda vm: LocalTransport(bus, vm)
        from wire.transports.pubsub.client import new_subscriber
        from wire.transports.pubsub.settings import PubSubSettings
        from wire.transports.pubsub.transport import PubSubTransport

        os.environ["PUBSUB_EMULATOR_HOST"] = self.spec.pubsub_emulator
        topics = dict(self.spec.pubsub_commands_topics)

        def subscriber() -> Any:
            return CountingSubscriber(new_subscriber(), self.tally)

        def transport(vm: str) -> AgentTransport:
            settings = PubSubSettings(
                project=self.spec.pubsub_project,
                topic=self.spec.pubsub_events_topic,
                commands_topic=topics.get(vm, "unused"),
                commands_subscription=f"commands-{vm}",
                vm_name=vm,
            )
            made = PubSubTransport(settings, subscriber_factory=subscriber, emulator=True)
            self._closers.append(made.close)
            return made

        return transport

    def _agent(self, vm: str) -> VirtualAgent:
        if not hasattr(self, "_make_transport"):
            self._make_transport = self._transports()
        state = Path(self.spec.state_dir) / vm
        state.mkdir(parents=True, exist_ok=True)
        ledger = CommandLedger(state / "commands.db", clock=self._system)
        self._closers.append(ledger.close)
        readiness = Readiness(follows_commands=True)
        imds = AzureImdsClient.for_base_url(f"{self.spec.metadata_url}/vm/{vm}")
        processor = CommandProcessor(
            vm_name=vm,
            cloud=Cloud.AZURE,
            ledger=ledger,
            readiness=readiness,
            approver=imds,
            verify_key=self._verify_key,
            dry_run=False,
            clock=self._system,
        )
        engagement = Engagement(self.clock.monotonic, self.spec.linger_seconds)
        return VirtualAgent(vm, self._make_transport(vm), imds, processor, readiness, engagement, self.tally)

    # ---- control (from the orchestrator's thread)

    def start(self) -> None:
        """Every agent takes its first turn at a random moment of one idle wait, as agents started
        at different times would."""
        rng = random.Random(self.spec.seed)
        now = time.monotonic()
        with self._lock:
            for vm in self.spec.vms:
                self._push(now + rng.uniform(0.0, COMMAND_IDLE_WAIT_SECONDS), vm)
        self._loop.start()

    def changed(self, vms: Sequence[str]) -> None:
        """These VMs' documents changed: each reads its own and opens its command path (Agent._wake)."""
        for vm in vms:
            self.agents[vm].changed = True
            self._submit(vm)

    def jump(self, seconds: float) -> None:
        """Move the engagement clock; every agent takes a turn now (its wait was bounded by the
        linger it had left)."""
        self.clock.jump(seconds)
        for vm in self.spec.vms:
            self._submit(vm)

    def stats(self) -> dict[str, Any]:
        snapshot = self.tally.snapshot()
        with self._lock:
            waiting = sum(1 for agent in self.agents.values() if agent.registered is not None)
        snapshot["path_open"] = sum(1 for agent in self.agents.values() if agent.path_open)
        snapshot["doorbells_waited_on"] = waiting
        snapshot["agents"] = len(self.agents)
        return snapshot

    def close(self) -> None:
        self._stop.set()
        self._wake()
        if self._loop.is_alive():
            self._loop.join(10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        for closer in reversed(self._closers):
            try:
                closer()
            except Exception:  # noqa: S112 - closing what is left; one failure must not keep the rest open
                continue

    # ---- the scheduler

    def _push(self, due: float, vm: str) -> None:
        self._sequence += 1
        heapq.heappush(self._timers, (due, self._sequence, vm))

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            return

    def _submit(self, vm: str) -> None:
        agent = self.agents[vm]
        with self._lock:
            if agent.busy:
                agent.again = True
                return
            agent.busy = True
        self._pool.submit(self._turn, agent)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                timeout = None if not self._timers else max(0.0, self._timers[0][0] - time.monotonic())
            for key, _ in self._selector.select(min(timeout, 1.0) if timeout is not None else 1.0):
                if key.data is None:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except OSError:
                        pass
                    continue
                agent = self.agents[key.data]
                with self._lock:
                    self._unregister(agent)
                self._submit(agent.vm)
            now = time.monotonic()
            due: list[str] = []
            with self._lock:
                while self._timers and self._timers[0][0] <= now:
                    due.append(heapq.heappop(self._timers)[2])
            for vm in due:
                self._submit(vm)

    def _unregister(self, agent: VirtualAgent) -> None:
        if agent.registered is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(agent.registered)
            agent.registered = None

    def _turn(self, agent: VirtualAgent) -> None:
        started = time.thread_time()
        kind = "idle"
        next_at: float | None = None
        try:
            if agent.changed:
                agent.changed = False
                kind = "engaged"
                try:
                    agent.read_document()
                except Exception:
                    agent.changed = True  # read again at the retry: the watcher tells a change once
                    raise
            if agent.wanted():
                kind = "engaged"
                next_at = self._receive(agent)
            else:
                with self._lock:
                    self._unregister(agent)
                agent.rest()
                next_at = time.monotonic() + COMMAND_IDLE_WAIT_SECONDS
        except Exception as error:
            self.tally.fail(agent.vm, error)
            next_at = time.monotonic() + RETRY_SECONDS
        finally:
            self.tally.spend(kind, time.thread_time() - started)
            self.tally.add(f"turns_{kind}")
            with self._lock:
                if next_at is not None:
                    self._push(next_at, agent.vm)
                agent.busy = False
                again, agent.again = agent.again, False
            self._wake()
            if again:
                self._submit(agent.vm)

    def _receive(self, agent: VirtualAgent) -> float:
        """A receive of an engaged agent; when its next turn is."""
        wait = agent.command_wait()
        if self.spec.transport == "local":
            agent.receive(0.0)  # hangs the doorbell, reads what is queued; the selector waits in its place
            doorbell = doorbell_of(agent.transport)
            with self._lock:
                if doorbell is not None and agent.registered is None:
                    self._selector.register(doorbell, selectors.EVENT_READ, agent.vm)
                    agent.registered = doorbell
            return time.monotonic() + wait
        agent.receive(min(wait, PUBSUB_PULL_WAIT))
        return time.monotonic()  # an engaged Pub/Sub agent pulls again at once


def serve(spec: FleetSpec, connection: Connection) -> None:
    """A process (or thread) of virtual agents, answering the orchestrator's requests:
    ("start",), ("changed", [vm, ...]), ("jump", seconds), ("stats",), ("stop",)."""
    fleet: Fleet | None = None
    try:
        fleet = Fleet(spec)
        connection.send(("ready", len(fleet.agents)))
        while True:
            request = connection.recv()
            kind = request[0]
            if kind == "start":
                fleet.start()
                connection.send("ok")
            elif kind == "changed":
                fleet.changed(request[1])
                connection.send("ok")
            elif kind == "jump":
                fleet.jump(request[1])
                connection.send("ok")
            elif kind == "stats":
                connection.send(fleet.stats())
            elif kind == "stop":
                connection.send("ok")
                return
    except EOFError:
        return
    except Exception as error:
        connection.send(("failed", f"{type(error).__name__}: {error}"))
        raise
    finally:
        if fleet is not None:
            fleet.close()


@dataclass
class Workers:
    """The orchestrator's side: one connection per process (or thread) of virtual agents."""

    connections: list[Connection] = field(default_factory=list)
    owners: dict[str, int] = field(default_factory=dict)
    handles: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, index: int, request: tuple[Any, ...]) -> Any:
        with self.lock:
            self.connections[index].send(request)
            reply = self.connections[index].recv()
        if isinstance(reply, tuple) and reply and reply[0] == "failed":
            raise RuntimeError(f"virtual agents {index}: {reply[1]}")
        return reply

    def each(self, request: tuple[Any, ...]) -> list[Any]:
        return [self.call(index, request) for index in range(len(self.connections))]

    def changed(self, vms: Sequence[str]) -> None:
        by_worker: dict[int, list[str]] = {}
        for vm in vms:
            by_worker.setdefault(self.owners[vm], []).append(vm)
        for index, names in by_worker.items():
            self.call(index, ("changed", names))

    def stats(self) -> dict[str, Any]:
        """The counts, CPU seconds and gauges of every process, summed."""
        counts: Counter[str] = Counter()
        cpu: dict[str, float] = {}
        failures: Counter[str] = Counter()
        tracebacks: dict[str, str] = {}
        total: dict[str, Any] = {
            "counts": counts,
            "cpu": cpu,
            "failures": failures,
            "tracebacks": tracebacks,
            "path_open": 0,
            "doorbells_waited_on": 0,
        }
        for snapshot in self.each(("stats",)):
            counts.update(snapshot["counts"])
            failures.update(snapshot["failures"])
            for kind, text in snapshot["tracebacks"].items():
                tracebacks.setdefault(kind, text)
            for name, seconds in snapshot["cpu"].items():
                cpu[name] = cpu.get(name, 0.0) + seconds
            total["path_open"] += snapshot["path_open"]
            total["doorbells_waited_on"] += snapshot["doorbells_waited_on"]
        return total

    def stop(self) -> None:
        for index in range(len(self.connections)):
            try:
                self.call(index, ("stop",))
            except (OSError, EOFError, RuntimeError):
                continue
        for handle in self.handles:
            handle.join(30)
        for connection in self.connections:
            connection.close()


def start_workers(specs: Sequence[FleetSpec], in_process: bool = False) -> Workers:
    """One process per spec (spawned: the orchestrator runs threads), or one thread each."""
    import multiprocessing

    workers = Workers()
    context = multiprocessing.get_context("spawn")
    try:
        for index, spec in enumerate(specs):
            ours, theirs = context.Pipe()
            if in_process:
                handle: Any = threading.Thread(target=serve, args=(spec, theirs), name=f"fleet-{index}", daemon=True)
            else:
                handle = context.Process(target=serve, args=(spec, theirs), name=f"fleet-{index}", daemon=True)
            handle.start()
            workers.connections.append(ours)
            workers.handles.append(handle)
            workers.owners.update((vm, index) for vm in spec.vms)
        for index, connection in enumerate(workers.connections):
            reply = connection.recv()
            if not (isinstance(reply, tuple) and reply[0] == "ready"):
                raise RuntimeError(f"virtual agents {index} did not start: {reply}")
    except BaseException:
        workers.stop()
        raise
    return workers
