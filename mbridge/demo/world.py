"""The embedded backbone of the demo: simulators, one agent per VM, the SQLite bus, the local
function host and its load-balancer pool, all in this process (agents and host in threads).

`DemoWorld` is what `play` needs from any backbone: where to inject maintenance, a way to feed
what happened into an `Observer`, the pools as they are, and where the audit log is.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.config import AgentSettings
from agent.main import run_agent
from agent.proofs import AzureAttestedProver, GceIdentityProver, Prover
from agent.sources.azure.client import AzureImdsClient
from agent.sources.gce.client import GceMetadataClient
from functions.central.event_grid import AzureScope
from functions.central.gce_upcoming import GceScope
from functions.core.policy import Policy, policy_document
from functions.local_app.balancer import LocalPool
from functions.local_app.central import CentralFeedReader, azure_reports, gce_reports
from functions.local_app.host import LocalFunctionHost
from functions.local_app.recording import Recorder
from functions.local_app.store import SqliteStore
from functions.trust.trust_file import verifier_from_trust
from functions.trust.verifiers import CloudVerifier
from mbridge.demo.flows import AZURE_VMS, GCE_VM, POOLS
from mbridge.demo.timeline import Observer, departure_of
from simulator import Simulator
from simulator.azure_api import SIM_RESOURCE_GROUP, SIM_SUBSCRIPTION_ID
from simulator.gce_api.project import PROJECT_ID
from wire.commands import Command
from wire.envelope import decode
from wire.errors import MalformedEnvelopeError
from wire.identity import DEFAULT_AUDIENCE, TRUST_FILE_FORMAT, UnverifiedError
from wire.model import Cloud
from wire.signing import generate_keypair, load_private_key, sign_command
from wire.transports.base import OutboundMessage
from wire.transports.local import LocalBus

# The agents poll twice a second here (the documented once a second also works; it only adds
# half a second on average to every detection).
POLL_INTERVAL = 0.5
READER = "demo"


class DemoWorld(Protocol):
    # Seconds the slowest witness may come after what it saw: the narration holds each line that
    # long, so that lines are printed in the order things happened (report.LiveLines).
    witness_lag: float

    def control_url(self, cloud: Cloud) -> str:
        """The simulator's base URL for the control API of `cloud`."""
        ...

    def poll(self, observer: Observer) -> None:
        """Feed everything new (envelopes, audit records, approval POSTs) into `observer`."""
        ...

    def pools(self) -> Mapping[str, Sequence[str]]:
        """Which VMs take traffic now, by pool."""
        ...

    def describe(self) -> list[str]:
        """Lines saying what runs and where to look (audit log, logs)."""
        ...

    def forge(self, by: str, body: bytes) -> None:
        """Publish `body` as VM `by`'s compromised agent would: with `by`'s own genuine proof."""
        ...

    def sender_of(self, body: bytes) -> str | None:
        """The VM a message's proof names (checked as the functions check it), or None."""
        ...

    def reads_central_feed(self, cloud: Cloud) -> bool:
        """Whether the functions here also read `cloud`'s control-plane feed (a dead agent's flow needs it)."""
        ...

    def stop_agent(self, vm: str) -> None:
        """Stop VM `vm`'s agent, as if it crashed: nothing more is reported from that VM."""
        ...

    def restart_agent(self, vm: str) -> None:
        """Start VM `vm`'s stopped agent again, as its operator would once told it was silent."""
        ...


def agent_settings(cloud: Cloud, url: str, vm: str, state_dir: Path, **transport: object) -> AgentSettings:
    """An agent of the demo: no health server, quick polls; `transport` picks the bus."""
    values: dict[str, object] = {
        "cloud": cloud,
        "metadata_url": url,
        "vm_name": vm,
        "transport": "local",
        "jsonl_path": "-",
        "state_dir": state_dir,
        "bus_path": state_dir / "bus.db",
        "poll_interval": POLL_INTERVAL,
        "listen": None,
        "dry_run": False,
        "verify_key": None,
        "servicebus_namespace": None,
        "servicebus_connection_string": None,
        "servicebus_topic": "maintenance-events",
        "servicebus_commands_queue": "maintenance-commands",
        "pubsub_project": None,
        "pubsub_topic": "maintenance-events",
        "pubsub_commands_subscription": None,
        "flush_seconds": 2.0,
    }
    values.update(transport)
    return AgentSettings(**values)  # type: ignore[arg-type]


@dataclass
class Simulators:
    """The Azure simulator (availability set, Spot VM, scale-set instance) and the GCE one."""

    azure: Simulator
    gce: Simulator
    _approvals_told: int = 0
    _log_told: dict[str, int] = field(default_factory=dict)  # log entries read so far, per simulator

    @classmethod
    def start(cls, speed: float) -> Simulators:
        azure = Simulator(cloud="azure", vm_names=list(AZURE_VMS), speed=speed).start()
        gce = Simulator(cloud="gce", vm_names=[GCE_VM], speed=speed).start()
        return cls(azure, gce)

    def endpoints(self) -> list[tuple[Cloud, str, str]]:
        """(cloud, VM, metadata URL) of every VM."""
        return [
            *((Cloud.AZURE, vm, url) for vm, url in zip(self.azure.vm_names, self.azure.base_urls)),
            *((Cloud.GCE, vm, url) for vm, url in zip(self.gce.vm_names, self.gce.base_urls)),
        ]

    def wait_until_watched(self, timeout: float) -> None:
        """Every VM's agent has asked its metadata service at least once, and every GCE agent has read
        maintenance-event itself (GCE only warns a VM that queried that key since the last event, so
        a flow injected before would be lost on purpose; a GCE agent's first request is instance/id)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = {**self.azure.traffic(), **self.gce.traffic()}
            gce = self.gce.gce_values()
            asked = all(vm in seen and seen[vm]["total"] > 0 for _, vm, _ in self.endpoints())
            if asked and all(gce.get(vm, {}).get("watched") for vm in self.gce.vm_names):
                return
            time.sleep(0.05)
        raise TimeoutError(f"not every agent reached its metadata service within {timeout:g} s")

    def tell(self, observer: Observer) -> None:
        """What the simulators witnessed since the last call: approval POSTs (what reached IMDS), and
        VMs deleted by their event (their metadata service stopped answering)."""
        approvals = self.azure.approvals()
        for entry in approvals[self._approvals_told :]:
            observer.approval(entry)
        self._approvals_told = len(approvals)
        for name, sim in (("azure", self.azure), ("gce", self.gce)):
            entries = sim.log_entries()
            for entry in entries[self._log_told.get(name, 0) :]:
                departure = departure_of(entry)
                if departure is not None:
                    observer.departure(*departure)
            self._log_told[name] = len(entries)

    def trust(self) -> dict[str, object]:
        """One trust file for both simulators: what verifies the proofs their VMs' agents attach."""
        return {**self.azure.trust(), **self.gce.trust(), "format": TRUST_FILE_FORMAT}

    def verifier(self) -> CloudVerifier:
        return verifier_from_trust(self.trust())

    def prover(self, vm: str) -> Prover:
        """What VM `vm`'s agent proves its identity with: its own metadata service."""
        cloud, url = next((cloud, url) for cloud, name, url in self.endpoints() if name == vm)
        if cloud is Cloud.AZURE:
            return AzureAttestedProver(AzureImdsClient.for_base_url(url), time.monotonic)
        return GceIdentityProver(GceMetadataClient.for_base_url(url), DEFAULT_AUDIENCE)

    def stop(self) -> None:
        self.azure.stop()
        self.gce.stop()


def sender_of(verifier: CloudVerifier, body: bytes) -> str | None:
    """The VM a message's proof names, or None when it has none that verifies."""
    try:
        envelope = decode(body)
        now = datetime.now(timezone.utc)
        return verifier.verify(envelope, now, now).vm
    except (MalformedEnvelopeError, UnverifiedError):
        return None


def forged_message(prover: Prover, by: str, body: bytes) -> OutboundMessage:
    """A compromised agent's message: its own proof on a report of its choosing."""
    proven = prover.prove(body)
    envelope = decode(proven)
    attributes = {"type": envelope.type, "vm": by, "cloud": envelope.source.split("/")[1]}
    return OutboundMessage(
        envelope.id, proven, key=by, attributes=attributes, message_id=hashlib.sha256(proven).hexdigest()
    )


@dataclass(frozen=True)
class CommandKeys:
    """The demo's command-signing key pair, made for the run: the functions sign, the agents verify."""

    private: Ed25519PrivateKey
    private_pem: bytes  # as the functions' MBRIDGE_SIGNING_KEY takes it
    public: str  # PEM, as an agent's --verify-key takes it

    @classmethod
    def generate(cls) -> CommandKeys:
        private, public = generate_keypair()
        return cls(load_private_key(private), private, public.decode("ascii"))

    def sign(self, command: Command) -> Command:
        return sign_command(command, self.private)


@dataclass
class AgentThreads:
    """One agent per VM, each in a thread of this process with a stop of its own."""

    running: dict[str, tuple[threading.Thread, threading.Event]] = field(default_factory=dict)

    settings: dict[str, AgentSettings] = field(default_factory=dict)

    def start(self, settings: AgentSettings) -> None:
        stop = threading.Event()
        thread = threading.Thread(target=run_agent, args=(settings, stop), name=f"agent-{settings.vm_name}")
        thread.daemon = True
        thread.start()
        self.running[settings.vm_name or ""] = (thread, stop)
        self.settings[settings.vm_name or ""] = settings

    def restart(self, vm: str) -> None:
        """Start a stopped agent again, with its settings and its state directory (its ledger)."""
        self.start(self.settings[vm])

    def stop_one(self, vm: str) -> None:
        thread, stop = self.running[vm]
        stop.set()
        thread.join(timeout=15)

    def halt(self) -> None:
        for _, stop in self.running.values():
            stop.set()
        for thread, _ in self.running.values():
            thread.join(timeout=15)


class EmbeddedWorld:
    """Everything on the embedded SQLite bus, in this process."""

    # Every witness is read in this process each poll: the bus and the audit log as they are
    # written, the approvals from the simulator's own log.
    witness_lag = 0.5

    def __init__(self, workdir: Path, policy: Policy, speed: float) -> None:
        self.workdir = workdir
        self.bus = LocalBus(workdir / "bus.db")
        self.store = SqliteStore(workdir / "functions.db")
        self.pool = LocalPool(workdir / "pool.db")
        for name, vms in POOLS.items():
            self.pool.add(name, vms)
        self.sims = Simulators.start(speed)
        self.agents = AgentThreads()
        self._host_stop = threading.Event()
        clock = lambda: datetime.now(timezone.utc)  # noqa: E731
        # What `mbridge replay` needs to tell what the functions did: everything they took, the policy
        # and the trust file they ran with (the simulators' keys are made for this run only).
        self.replay = ReplayFiles.write(workdir, policy, self.sims.trust())
        self._recorder = Recorder(self.replay.recorded)
        # As deployed: the functions verify each sender's proof, and sign the commands the agents verify.
        self.commands = CommandKeys.generate()
        host = LocalFunctionHost(
            self.bus, self.store, self.pool, policy, clock, verifier=self.sims.verifier(), signer=self.commands.sign,
            recorder=self._recorder,
        )  # fmt: skip
        self._host = threading.Thread(target=host.run, args=(self._host_stop,), name="function-host", daemon=True)
        # The control plane's path: the Azure simulator's central feed (Event Grid), read as its
        # subscription would deliver it, swept for silent agents every second (a minute in the
        # clouds); and the GCE simulator's (its system-event log entries, as a log sink delivers them).
        scope = AzureScope(subscriptions=(SIM_SUBSCRIPTION_ID,), resource_groups=(SIM_RESOURCE_GROUP,))
        self._central = (
            CentralFeedReader(
                self.sims.azure.base_urls[0], host.deps, azure_reports(scope), clock, sweep_every=timedelta(seconds=1),
                recorder=self._recorder,
            ),
            CentralFeedReader(
                self.sims.gce.base_urls[0], host.deps, gce_reports(GceScope(projects=(PROJECT_ID,))), clock,
                sweep_every=None, recorder=self._recorder,
            ),
        )  # fmt: skip
        self._central_thread = threading.Thread(
            target=_keep_reading, args=(self._central, self._host_stop), name="central-feed", daemon=True
        )
        self._verifier = self.sims.verifier()
        self._position = 0
        self._audit_seen = 0

    def start(self, timeout: float = 15.0) -> EmbeddedWorld:
        self._host.start()
        self._central_thread.start()
        for cloud, vm, url in self.sims.endpoints():
            state_dir = self.workdir / "agents" / vm
            settings = agent_settings(
                cloud, url, vm, state_dir, bus_path=self.bus.path, verify_key=self.commands.public
            )
            self.agents.start(settings)
        self.sims.wait_until_watched(timeout)
        return self

    def control_url(self, cloud: Cloud) -> str:
        return self.sims.azure.base_urls[0] if cloud is Cloud.AZURE else self.sims.gce.base_urls[0]

    def poll(self, observer: Observer) -> None:
        for message in self.bus.read_events(self._position, limit=500):
            self._position = message.seq
            observer.envelope(message.body, datetime.fromtimestamp(message.published_at, timezone.utc))
        records = self.store.query()
        for record in records[self._audit_seen :]:
            observer.audit(record)
        self._audit_seen = len(records)
        self.sims.tell(observer)

    def pools(self) -> Mapping[str, Sequence[str]]:
        return {name: self.pool.members(name) for name in POOLS}

    def describe(self) -> list[str]:
        db = self.workdir / "functions.db"
        return [
            audit_hint(db),
            f"recorded: {self.replay.recorded}, what the functions took; replay it with `{self.replay.command()}`",
            f"bus: {self.bus.path}; agent state: {self.workdir / 'agents'}; logs: {self.workdir / 'demo.log'}",
        ]

    def forge(self, by: str, body: bytes) -> None:
        self.bus.publish_event(forged_message(self.sims.prover(by), by, body))

    def sender_of(self, body: bytes) -> str | None:
        return sender_of(self._verifier, body)

    def reads_central_feed(self, cloud: Cloud) -> bool:
        return True

    def stop_agent(self, vm: str) -> None:
        self.agents.stop_one(vm)

    def restart_agent(self, vm: str) -> None:
        self.agents.restart(vm)

    def close(self) -> None:
        self.agents.halt()
        self._host_stop.set()
        self._host.join(timeout=10)
        self._central_thread.join(timeout=10)
        for reader in self._central:
            reader.close()
        self.sims.stop()
        self._recorder.close()
        self.store.close()
        self.pool.close()
        self.bus.close()


@dataclass(frozen=True)
class ReplayFiles:
    """What the demo leaves in its work dir for `mbridge replay`: the functions' inputs as they took them
    (`functions.local_app.recording`), and the policy and trust file they ran with."""

    recorded: Path
    policy: Path
    trust: Path

    @classmethod
    def write(cls, workdir: Path, policy: Policy, trust: Mapping[str, object]) -> ReplayFiles:
        files = cls(workdir / "recorded.jsonl", workdir / "policy.json", workdir / "trust.json")
        files.policy.write_text(json.dumps(policy_document(policy), indent=2) + "\n", encoding="utf-8")
        files.trust.write_text(json.dumps(trust, indent=2) + "\n", encoding="utf-8")
        return files

    def command(self) -> str:
        files = " ".join(
            f"{flag} {shlex.quote(str(path))}"
            for flag, path in (("--events", self.recorded), ("--policy", self.policy), ("--trust-file", self.trust))
        )
        return f"{mbridge_command()} replay {files}"


def mbridge_command(executable: str = sys.executable, which: Callable[[str], str | None] = shutil.which) -> str:
    """How to run this installation's `mbridge` from a shell: `make demo` installs it in
    `.venv-demo/bin`, which is not on the PATH, so a bare `mbridge` would be another one, or none."""
    script = Path(executable).parent / "mbridge"
    if not script.is_file():
        return f"{shlex.quote(executable)} -m mbridge.cli"
    found = which("mbridge")
    if found is not None and Path(found).resolve() == script.resolve():
        return "mbridge"
    return shlex.quote(str(script))


def audit_hint(db: Path) -> str:
    """Where the audit log is, and the command that reads it, runnable as printed."""
    command = f"{mbridge_command()} audit list --db {shlex.quote(str(db))}"
    return f"audit log: {db}; read it with `{command}` (add --vm NAME or --event ID to narrow it)"


def _keep_reading(readers: Sequence[CentralFeedReader], stop: threading.Event, every: float = 0.1) -> None:
    """Read the central feeds until `stop`, as the function host reads the bus."""
    while not stop.is_set():
        if not sum(reader.step() for reader in readers):
            stop.wait(every)
