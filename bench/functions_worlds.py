"""The two worlds the end-to-end and fan-in benchmarks run events through, with what each needs
to say when a step happened.

- `EmbeddedBench`: the embedded backbone of `mbridge demo` (mbridge/demo/world.py)
  built for any set of VMs: one Azure simulator serving every VM (one shared event store), one
  agent thread per VM on the SQLite bus, the local function host in a thread with its SQLite
  store and local load-balancer pool. Wired as deployed: every agent attaches its VM's proof of
  identity (the simulator's attested documents), the host verifies them with the simulator's
  trust and signs its commands, and the agents execute only commands signed with that key. The
  pool and the command sender are wrapped (bench/functions_fakes.py) to note when a VM left the
  pool and when a command was on the bus.
- `PubSubBench`: the demo's Google world (mbridge/demo/pubsub_world.py) as it is —
  Pub/Sub and Firestore emulators, the Cloud Functions entry under functions-framework behind the
  push subscription, agents on the emulator, the function verifying proofs with the simulators'
  trust file and signing its commands — with the agents polling once a second and the demo's own
  observers left out (the bench reads the witnesses once, at the end).

Both poll IMDS at the documented 1 s and run the simulator at `SPEED` (a Reboot's 15 minutes of
notice become 90 s; nothing measured here waits for NotBefore).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from bench.functions_fakes import RecordingBalancer, RecordingSender
from bench.functions_witness import LedgerRow, first_done, read_ledger
from functions.core.policy import Policy, Pool
from functions.core.ports import AuditRecord
from functions.local_app.balancer import LocalPool
from functions.local_app.host import LocalFunctionHost
from functions.local_app.store import SqliteStore
from functions.trust.trust_file import verifier_from_trust
from mbridge.demo.emulators import free_port
from mbridge.demo.flows import AZURE_VMS
from mbridge.demo.pubsub_bus import COMMANDS_TOPIC, OBSERVER_SUBSCRIPTION, PROJECT
from mbridge.demo.pubsub_world import PubSubWorld
from mbridge.demo.world import AgentThreads, CommandKeys, Simulators, agent_settings
from simulator import Simulator
from wire.commands import CommandType, decode_command
from wire.envelope import decode
from wire.errors import BridgeError
from wire.model import Cloud, EventStatus, MaintenanceEvent
from wire.transports.local import LocalBus

POLL_INTERVAL = 1.0  # Azure's documented poll, the agent's default
SPEED = 10.0
POOL = "bench"
WATCH_TIMEOUT = 30.0
COMMANDS_SUBSCRIPTION = "bench-commands"
PULL_BATCH = 500
PULL_TIMEOUT = 0.5  # the emulator holds an empty pull until then: the end of what was published


def lane_policy(vms: Iterable[str]) -> Policy:
    """The default policy with no drain period, each VM in a pool of its own: events of different
    VMs then never touch the same budget record (on Firestore, two invocations writing one
    document contend and back off for a second)."""
    pools = tuple(Pool(name=vm, vms=frozenset({vm}), max_drained=None) for vm in sorted(vms))
    # A lane's pools are the agents' /readyz read directly, no probe between: out at once.
    return Policy(drain_period_seconds=0.0, readiness_probe_seconds=0.0, pools=pools)


@dataclass
class Sightings:
    """When each step of each event was seen, by lower-cased EventId (Unix seconds)."""

    detected: dict[str, float] = field(default_factory=dict)  # the envelope's time: when an agent saw it
    published: dict[str, float] = field(default_factory=dict)  # when the bus took the envelope
    picked_up: dict[str, float] = field(default_factory=dict)  # the function's invocation (decision record)
    approval_sent: dict[str, float] = field(default_factory=dict)  # the approve command on the bus
    approval_taken: dict[str, float] = field(default_factory=dict)  # the agent began the approve command

    def see_envelope(self, body: bytes, published_at: float) -> None:
        try:
            envelope = decode(body)
        except BridgeError:
            return
        event = envelope.data
        if isinstance(event, MaintenanceEvent) and event.status is EventStatus.SCHEDULED:
            key = event.event_id.lower()
            _earliest(self.detected, key, envelope.time.timestamp())
            _earliest(self.published, key, published_at)

    def see_audit(self, records: Iterable[AuditRecord]) -> None:
        for record in records:
            if record.kind == "decision" and record.status == EventStatus.SCHEDULED.value:
                _earliest(self.picked_up, record.event_id.lower(), record.time.timestamp())

    def see_command(self, body: bytes, sent_at: float) -> None:
        command = decode_command(body).command
        if command.type is CommandType.APPROVE:
            _earliest(self.approval_sent, command.event_id.lower(), sent_at)

    def see_ledger(self, rows: Iterable[LedgerRow]) -> None:
        for row in rows:
            if row.type == CommandType.APPROVE.value:
                _earliest(self.approval_taken, row.event_id.lower(), row.received_at)

    def stages(self, event_id: str) -> dict[str, float | None]:
        key = event_id.lower()
        return {
            "detected": self.detected.get(key),
            "published": self.published.get(key),
            "picked_up": self.picked_up.get(key),
            "approval_sent": self.approval_sent.get(key),
            "approval_taken": self.approval_taken.get(key),
        }


STAGES = ("detected", "published", "picked_up", "drained", "approval_sent", "approval_taken", "approved")


def _earliest(found: dict[str, float], key: str, moment: float) -> None:
    found[key] = min(found.get(key, moment), moment)


class World(Protocol):
    """What the benchmarks need from a running world."""

    vms: list[str]

    @property
    def simulator(self) -> Simulator: ...

    def drained_at(self, vm: str, after: float) -> float | None:
        """When `vm` was first taken out of traffic at or after `after`, if it was."""
        ...

    def restored_at(self, vm: str, after: float) -> float | None:
        """When `vm` was first put back at or after `after`, if it was."""
        ...

    def sightings(self) -> Sightings:
        """Every step seen so far (read once, when the events are over)."""
        ...


@contextmanager
def warnings_to(path: Path) -> Iterator[None]:
    """Send the product's warnings to a file while the block runs (the agents warn, for instance,
    when they stop with envelopes still in their outbox), not onto the bench's report."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def wait_until_watched(simulator: Simulator, vms: Sequence[str], timeout: float = WATCH_TIMEOUT) -> None:
    """Every VM's agent has read its document at least once (a notice before that is not a notice)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        traffic = simulator.traffic()
        if all(traffic.get(vm, {"total": 0})["total"] > 0 for vm in vms):
            return
        time.sleep(0.05)
    raise TimeoutError(f"not every agent read its metadata within {timeout:g} s")


class EmbeddedBench:
    """Simulator, agent threads, SQLite bus and the local function host, in this process."""

    def __init__(
        self, workdir: Path, vms: Sequence[str], policy: Policy, speed: float = SPEED, forward: str = "own"
    ) -> None:
        self.workdir = workdir
        self.vms = list(vms)
        self._policy = policy
        self._speed = speed
        self.forward = forward  # the agents' --forward: "own" (their default) or "all"
        self.commands = CommandKeys.generate()  # the host signs with it, the agents verify
        self._stack = ExitStack()
        self._sim: Simulator | None = None
        self.bus: LocalBus | None = None
        self.store: SqliteStore | None = None
        self.balancer: RecordingBalancer | None = None
        self.sender: RecordingSender | None = None

    @property
    def simulator(self) -> Simulator:
        assert self._sim is not None, "start() first"
        return self._sim

    def state_dir(self, vm: str) -> Path:
        return self.workdir / "agents" / vm

    def start(self) -> EmbeddedBench:
        """Start everything; a failure half way stops what was started."""
        stack = self._stack
        try:
            bus = LocalBus(self.workdir / "bus.db")
            stack.callback(bus.close)
            store = SqliteStore(self.workdir / "functions.db")
            stack.callback(store.close)
            pool = LocalPool(self.workdir / "pool.db")
            stack.callback(pool.close)
            pool.add(POOL, self.vms)
            self.bus, self.store = bus, store
            self.balancer = RecordingBalancer(pool)
            # The simulator first: its trust is what verifies the proofs its VMs' agents attach.
            self._sim = Simulator(cloud="azure", vm_names=self.vms, speed=self._speed).start()
            stack.callback(self._sim.stop)
            host = LocalFunctionHost(
                bus,
                store,
                self.balancer,
                self._policy,
                lambda: datetime.now(timezone.utc),
                verifier=verifier_from_trust(self._sim.trust()),
                signer=self.commands.sign,
            )
            self.sender = RecordingSender(host.deps.sender)
            host.deps.sender = self.sender
            host_stop = threading.Event()
            host_thread = threading.Thread(target=host.run, args=(host_stop,), name="function-host", daemon=True)
            host_thread.start()
            stack.callback(host_thread.join, 10)
            stack.callback(host_stop.set)
            agents = AgentThreads()
            stack.callback(agents.halt)  # first of all: the agents stop before the bus and host go
            for vm, url in zip(self._sim.vm_names, self._sim.base_urls):
                settings = agent_settings(
                    Cloud.AZURE, url, vm, self.state_dir(vm), bus_path=bus.path, poll_interval=POLL_INTERVAL,
                    verify_key=self.commands.public, forward=self.forward,
                )  # fmt: skip
                agents.start(settings)
            wait_until_watched(self._sim, self.vms)
        except BaseException:
            stack.close()
            raise
        return self

    def close(self) -> None:
        self._stack.close()

    def drained_at(self, vm: str, after: float) -> float | None:
        assert self.balancer is not None
        removals = self.balancer.removals(vm, after)
        return removals[0].at if removals else None

    def restored_at(self, vm: str, after: float) -> float | None:
        assert self.balancer is not None
        restorations = self.balancer.restorations(vm, after)
        return restorations[0].at if restorations else None

    def sightings(self) -> Sightings:
        assert self.bus is not None
        assert self.store is not None
        assert self.sender is not None
        seen = Sightings()
        position = 0
        while batch := self.bus.read_events(position, limit=PULL_BATCH):
            for message in batch:
                seen.see_envelope(message.body, message.published_at)
            position = batch[-1].seq
        seen.see_audit(self.store.query())
        for sent in self.sender.sent(CommandType.APPROVE):
            seen.approval_sent.setdefault(sent.command.event_id.lower(), sent.at)
        for vm in self.vms:
            seen.see_ledger(read_ledger(self.state_dir(vm) / "commands.db"))
        return seen


class PubSubBench(PubSubWorld):
    """The demo's Pub/Sub-emulator world, agents polling at 1 s; its VMs are the demo's Azure VMs.

    Wired as the demo wires it: the function verifies proofs with the simulators' trust file and
    signs its commands with the world's key (`commands`), which the agents verify."""

    def __init__(self, workdir: Path, vms: Sequence[str], speed: float = SPEED) -> None:
        unknown = sorted(set(vms) - set(AZURE_VMS))
        if unknown:
            raise ValueError(f"the Pub/Sub world serves the demo's Azure VMs {AZURE_VMS}, not {unknown}")
        super().__init__(workdir, lane_policy(vms), speed)
        self.vms = list(vms)
        self._commands_subscription = f"projects/{PROJECT}/subscriptions/{COMMANDS_SUBSCRIPTION}"

    @property
    def simulator(self) -> Simulator:
        assert self.sims is not None, "start() first"
        return self.sims.azure

    def start(
        self, timeout: float = WATCH_TIMEOUT, progress: Callable[[str], None] = lambda _text: None
    ) -> PubSubBench:
        super().start(timeout, progress)
        try:
            # A pull subscription of the bench's own: when each approve command reached the topic.
            self._admin().create_subscription(
                request={"name": self._commands_subscription, "topic": f"projects/{PROJECT}/topics/{COMMANDS_TOPIC}"},
                timeout=10.0,
            )
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        # The simulators first: the GCE agent's long-polls then end at once, instead of each of its
        # watchers holding up the agents' stop for its join timeout.
        if self.sims is not None:
            self.sims.stop()
        super().close()

    # The demo watches the audit log ten times a second and pulls every envelope as it comes;
    # the bench reads them once at the end instead, so nothing but the product runs meanwhile.
    def _start_watching(self) -> None:
        return

    def _start_agents(self, sims: Simulators) -> None:
        agents = AgentThreads()
        self._cleanup.callback(agents.halt)
        for cloud, vm, url in sims.endpoints():
            port = free_port()
            self.health[vm] = f"http://127.0.0.1:{port}"
            settings = agent_settings(
                cloud, url, vm, self.workdir / "agents" / vm,
                transport="pubsub", pubsub_project=PROJECT, pubsub_topic="maintenance-events",
                pubsub_commands_subscription=f"maintenance-commands-{vm}", listen=("127.0.0.1", port),
                poll_interval=POLL_INTERVAL, verify_key=self.commands.public,
            )  # fmt: skip
            agents.start(settings)

    def _admin(self) -> Any:
        """The world's Pub/Sub admin client (a SubscriberClient on the emulator)."""
        return self._subscriber

    def ledger(self, vm: str) -> list[LedgerRow]:
        return read_ledger(self.workdir / "agents" / vm / "commands.db")

    def drained_at(self, vm: str, after: float) -> float | None:
        # The ReadinessBalancer drains by a `drain` command: /readyz turns unready, the agent
        # persists that, then finishes the command in its ledger — an upper bound, by milliseconds.
        row = first_done(self.ledger(vm), CommandType.DRAIN.value, after)
        return None if row is None else row.updated_at

    def drain_gaps(self, vm: str) -> list[float]:
        """Seconds between the agent beginning and finishing each drain command (the bound's slack)."""
        return [row.updated_at - row.received_at for row in self.ledger(vm) if row.type == CommandType.DRAIN.value]

    def restored_at(self, vm: str, after: float) -> float | None:
        row = first_done(self.ledger(vm), CommandType.RESTORE.value, after)
        return None if row is None else row.updated_at

    def sightings(self) -> Sightings:
        from google.cloud import firestore

        from functions.gcp_app.firestore_audit import FirestoreAuditLog

        seen = Sightings()
        for message in self._pull_all(f"projects/{PROJECT}/subscriptions/{OBSERVER_SUBSCRIPTION}"):
            seen.see_envelope(bytes(message.data), message.publish_time.timestamp())
        for message in self._pull_all(self._commands_subscription):
            seen.see_command(bytes(message.data), message.publish_time.timestamp())
        client = firestore.Client(project=PROJECT)
        try:
            seen.see_audit(FirestoreAuditLog(client).query())
        finally:
            client.close()  # type: ignore[no-untyped-call]  # the library's close() is not annotated
        for vm in self.vms:
            seen.see_ledger(self.ledger(vm))
        return seen

    def _pull_all(self, subscription: str) -> list[Any]:
        from google.api_core import exceptions as api_errors

        messages: list[Any] = []
        while True:
            try:
                response = self._admin().pull(
                    subscription=subscription, max_messages=PULL_BATCH, timeout=PULL_TIMEOUT, retry=None
                )
            except api_errors.DeadlineExceeded:
                return messages
            received = list(response.received_messages)
            if not received:
                return messages
            self._admin().acknowledge(subscription=subscription, ack_ids=[item.ack_id for item in received])
            messages.extend(item.message for item in received)
