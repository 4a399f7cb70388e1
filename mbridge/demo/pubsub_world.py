"""The Google backbone of the demo: Google's Pub/Sub and Firestore emulators, and the Cloud
Functions entry (`main.py`: `on_maintenance_event`) served by functions-framework on loopback.

    agents ─► maintenance-events ─► push subscription ─► EventarcShim ─► functions-framework
                    │                 (as Eventarc's)     (CloudEvent)     on_maintenance_event
                    └─► demo-observer (pull): what the demo sees                │
    agents ◄─ maintenance-commands-<vm> ◄─ maintenance-commands ◄──────────────┤ drain/approve/restore
    demo ◄─ FirestoreAuditLog.query ◄─ Firestore emulator (state, audit) ◄─────┘

- The agents run in threads of this process, on the real Pub/Sub transport, each with its own
  commands subscription and a health port: a VM is in its load-balancer pool while its `/readyz`
  answers 200, which is what the function's `drain`/`restore` commands flip (ReadinessBalancer; no
  instance groups are configured).
- The bus (topics and subscriptions) is pubsub_bus.py; the function and its settings
  pubsub_function.py; the stand-in for Eventarc eventarc_shim.py. (The emulator redelivers about a
  second later and keeps two pushes in flight per subscription; Pub/Sub backs off from 10 s and
  pushes many at once.)
- The demo sees envelopes and the audit log through pubsub_watch.py, and approvals through the
  simulators. At the end the audit log is written to `audit.jsonl` in the work dir, one record a
  line, as `mbridge audit list` prints them.

Every process is started in a process group of its own and stopped in `close()`, which also
undoes a start that failed half way.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import requests

from functions.core.policy import Policy
from functions.trust.verifiers import CloudVerifier
from mbridge.audit_cli import audit_line
from mbridge.demo.emulators import (
    FIRESTORE,
    PUBSUB,
    PeerProcess,
    accepts_connections,
    emulator_launcher,
    free_port,
    gcloud_sdk_root,
    launch_emulator,
    wait_ready,
)
from mbridge.demo.eventarc_shim import EventarcShim
from mbridge.demo.flows import POOLS
from mbridge.demo.pubsub_bus import (
    ADMIN_TIMEOUT,
    CENTRAL_TOPIC,
    COMMANDS_TOPIC,
    EVENTS_TOPIC,
    PROJECT,
    TICK_TOPIC,
    TRIGGER_SUBSCRIPTION,
    admin_clients,
    create_bus,
    create_central_bus,
    topic_path,
)
from mbridge.demo.pubsub_central import READ_EVERY, SinkRelay, Ticker, keep_going
from mbridge.demo.pubsub_function import (
    CENTRAL_TARGETS,
    FUNCTION_STARTUP_TIMEOUT,
    FUNCTION_TARGET,
    launch_function,
    policy_document,
    require_google_libraries,
)
from mbridge.demo.pubsub_watch import PubSubWatch
from mbridge.demo.timeline import Observer
from mbridge.demo.world import (
    AgentThreads,
    CommandKeys,
    Simulators,
    agent_settings,
    forged_message,
    sender_of,
)
from wire.model import Cloud

if TYPE_CHECKING:  # the Google libraries are imported once they are known to be installed
    from functions.gcp_app.firestore_audit import FirestoreAuditLog

LOG = logging.getLogger("mbridge.demo.pubsub")

READYZ_TIMEOUT = 2.0
REPO_ROOT = Path(__file__).resolve().parents[2]


class PubSubWorld:
    """The demo on Google's emulators and the Cloud Functions entry (see the module docstring)."""

    # The audit log is queried from the Firestore emulator and envelopes pulled from a subscription,
    # each by its own thread; a record is seen up to a second or two after its time (more while the
    # function is cold), an approval from the simulator's log at once.
    witness_lag = 2.0

    def __init__(self, workdir: Path, policy: Policy, speed: float) -> None:
        self.workdir = workdir
        self.policy = policy
        self.speed = speed
        self.logs = workdir / "logs"
        self.audit_export = workdir / "audit.jsonl"
        self.trust_file = workdir / "trust.json"
        self.commands = CommandKeys.generate()
        self._verifier: CloudVerifier | None = None
        self._publisher: Any = None
        self.pubsub: PeerProcess | None = None
        self.firestore: PeerProcess | None = None
        self.function: PeerProcess | None = None
        self.central_functions: dict[str, PeerProcess] = {}  # the control plane's path, by target
        self.central_shims: dict[str, EventarcShim] = {}
        self._central_stop = threading.Event()
        self.shim: EventarcShim | None = None
        self.sims: Simulators | None = None
        self.health: dict[str, str] = {}  # VM → base URL of its agent's health server
        self._cleanup = ExitStack()
        self._watch = PubSubWatch()
        self._agents = AgentThreads()
        self._subscriber: Any = None  # the Pub/Sub admin client, also the observer's puller
        self._audit_log: FirestoreAuditLog | None = None

    # ---- start

    def start(self, timeout: float = 15.0, progress: Callable[[str], None] = lambda _text: None) -> PubSubWorld:
        """Start everything, telling `progress` what it waits for (the emulators take seconds); on any
        failure what was started is stopped by `close()`.

        Raises:
            DemoSetupError: an emulator, Java or the Google libraries are missing, or a process did not start.
        """
        require_google_libraries(REPO_ROOT)
        policy = policy_document(self.policy)
        progress("looking for the Pub/Sub and Firestore emulators of the Google Cloud CLI")
        sdk_root = gcloud_sdk_root()
        for emulator in (PUBSUB, FIRESTORE):
            emulator_launcher(emulator, sdk_root)  # both are there before either starts
        # The simulators first: their trust file (what verifies their VMs' proofs) goes to the
        # function. And they bind their ports at once: started after the emulators, whose JVMs bind
        # theirs seconds after their free port was chosen, they could take one of those ports.
        self.sims = Simulators.start(self.speed)
        self._cleanup.callback(self.sims.stop)
        self._verifier = self.sims.verifier()
        self.trust_file.parent.mkdir(parents=True, exist_ok=True)
        self.trust_file.write_text(json.dumps(self.sims.trust(), indent=1), encoding="utf-8")
        progress(
            "starting the Pub/Sub and Firestore emulators (Java: about ten seconds) and the Cloud Functions "
            f"entries under functions-framework; their logs: {self.logs}/"
        )
        self.pubsub = self._started(launch_emulator(PUBSUB, self.logs, sdk_root))
        self.firestore = self._started(launch_emulator(FIRESTORE, self.logs, sdk_root))
        self.function = self._started(self._launch_function(policy))
        for target in CENTRAL_TARGETS:
            self.central_functions[target] = self._started(self._launch_function(policy, target))
        for emulator, peer in ((PUBSUB, self.pubsub), (FIRESTORE, self.firestore)):
            wait_ready(peer, emulator.ready_text, on_wait=progress)
            progress(f"{emulator.label} emulator ready on {peer.host}")
        self._point_clients_at_emulators()
        for function in (self.function, *self.central_functions.values()):
            wait_ready(function, accepts_connections(function.host), FUNCTION_STARTUP_TIMEOUT, on_wait=progress)
        progress("functions-framework serving the function and the control plane's two")
        self.shim = EventarcShim(self.function_url, topic_path(EVENTS_TOPIC)).start()
        self._cleanup.callback(self.shim.stop)
        for target, topic in zip(CENTRAL_TARGETS, (CENTRAL_TOPIC, TICK_TOPIC)):
            shim = EventarcShim(f"http://{self.central_functions[target].host}/", topic_path(topic)).start()
            self._cleanup.callback(shim.stop)
            self.central_shims[target] = shim
        self._create_bus()
        self._start_central(self.sims)
        self._start_watching()
        progress("topics and subscriptions made; starting the six agents")
        self._start_agents(self.sims)
        self.sims.wait_until_watched(timeout)
        return self

    def _started(self, peer: PeerProcess) -> PeerProcess:
        self._cleanup.callback(_quietly, f"stop {peer.name}", peer.stop)
        return peer

    @property
    def function_url(self) -> str:
        assert self.function is not None
        return f"http://{self.function.host}/"

    def _launch_function(self, policy: str, target: str = FUNCTION_TARGET) -> PeerProcess:
        assert self.pubsub is not None
        assert self.firestore is not None
        return launch_function(
            REPO_ROOT,
            policy,
            self.trust_file,
            self.commands.private_pem.decode("ascii"),
            self.pubsub.host,
            self.firestore.host,
            self.logs,
            target,
        )

    def _point_clients_at_emulators(self) -> None:
        """The agents (threads here) and the demo's own clients read the emulator hosts from the
        environment; the previous values come back in `close()`."""
        assert self.pubsub is not None
        assert self.firestore is not None
        for variable, host in ((PUBSUB.variable, self.pubsub.host), (FIRESTORE.variable, self.firestore.host)):
            self._cleanup.callback(_restore_variable, variable, os.environ.get(variable))
            os.environ[variable] = host

    def _create_bus(self) -> None:
        """The topics and subscriptions infra/ and Eventarc would create."""
        assert self.shim is not None
        publisher, subscriber = admin_clients()
        self._publisher = publisher
        self._cleanup.callback(_quietly, "close the Pub/Sub admin clients", subscriber.close)
        create_bus(publisher, subscriber, self.shim.url)
        log_entries, ticks = (self.central_shims[target].url for target in CENTRAL_TARGETS)
        create_central_bus(publisher, subscriber, log_entries, ticks)
        self._subscriber = subscriber

    def _start_central(self, sims: Simulators) -> None:
        """The log sink and the scheduler of the control plane's path (pubsub_central.py)."""
        relay, ticker = SinkRelay(sims.gce.base_urls[0], self._publisher), Ticker(self._publisher)
        threads = (
            keep_going(relay.step, READ_EVERY, self._central_stop, "sink-relay"),
            keep_going(ticker.step, ticker.every, self._central_stop, "scheduler-ticks"),
        )
        for thread in threads:
            self._cleanup.callback(thread.join, 10)
        self._cleanup.callback(self._central_stop.set)  # first: the clean-up runs the last callback first

    # ---- what the demo watches

    def _start_watching(self) -> None:
        from google.cloud import firestore

        from functions.gcp_app.firestore_audit import FirestoreAuditLog

        audit_log = FirestoreAuditLog(firestore.Client(project=PROJECT))
        self._audit_log = audit_log
        self._cleanup.callback(_quietly, "export the audit log", self._export_audit)
        self._watch.start(self._subscriber, audit_log, self._cleanup)

    def _start_agents(self, sims: Simulators) -> None:
        agents = self._agents
        self._cleanup.callback(agents.halt)
        for cloud, vm, url in sims.endpoints():
            state_dir = self.workdir / "agents" / vm
            # A fresh agent, as the emulators are fresh: no readiness or ledger from an earlier run.
            shutil.rmtree(state_dir, ignore_errors=True)
            port = free_port()
            self.health[vm] = f"http://127.0.0.1:{port}"
            settings = agent_settings(
                cloud, url, vm, state_dir,
                transport="pubsub", pubsub_project=PROJECT, pubsub_topic=EVENTS_TOPIC,
                pubsub_commands_subscription=f"maintenance-commands-{vm}", listen=("127.0.0.1", port),
                verify_key=self.commands.public,
            )  # fmt: skip
            agents.start(settings)

    # ---- DemoWorld

    def control_url(self, cloud: Cloud) -> str:
        assert self.sims is not None
        return self.sims.azure.base_urls[0] if cloud is Cloud.AZURE else self.sims.gce.base_urls[0]

    def poll(self, observer: Observer) -> None:
        self._watch.tell(observer)
        assert self.sims is not None
        self.sims.tell(observer)

    def pools(self) -> Mapping[str, Sequence[str]]:
        return {name: [vm for vm in vms if self._ready(vm)] for name, vms in POOLS.items()}

    def forge(self, by: str, body: bytes) -> None:
        assert self.sims is not None
        message = forged_message(self.sims.prover(by), by, body)
        attributes = {**message.attributes, "envelope_id": message.envelope_id}
        future = self._publisher.publish(topic_path(EVENTS_TOPIC), message.body, **attributes)
        future.result(timeout=ADMIN_TIMEOUT)

    def sender_of(self, body: bytes) -> str | None:
        assert self._verifier is not None
        return sender_of(self._verifier, body)

    def reads_central_feed(self, cloud: Cloud) -> bool:
        # The Cloud Functions read GCE's system-event log (a log sink); Azure's feed is Event Grid's,
        # delivered to the Azure Functions (docs/architecture.md#two-paths).
        return cloud is Cloud.GCE

    def stop_agent(self, vm: str) -> None:
        self._agents.stop_one(vm)

    def restart_agent(self, vm: str) -> None:
        self._agents.restart(vm)

    def _ready(self, vm: str) -> bool:
        try:
            return requests.get(self.health[vm] + "/readyz", timeout=READYZ_TIMEOUT).status_code == 200
        except (KeyError, requests.RequestException):
            return False

    def describe(self) -> list[str]:
        assert self.pubsub is not None
        assert self.firestore is not None
        assert self.shim is not None
        readyz = ", ".join(f"{vm} {url.rsplit(':', 1)[1]}" for vm, url in self.health.items())
        return [
            f"Pub/Sub emulator {self.pubsub.host} (project {PROJECT}: topics {EVENTS_TOPIC}, {COMMANDS_TOPIC}); "
            f"Firestore emulator {self.firestore.host}",
            f"function: {self.function_url} (functions-framework, {FUNCTION_TARGET} from main.py), fed by the "
            f"push subscription {TRIGGER_SUBSCRIPTION} through the Eventarc shim {self.shim.url}",
            "control plane: "
            + "; ".join(f"{target} on {peer.host}" for target, peer in self.central_functions.items())
            + f", fed by {CENTRAL_TOPIC} (the GCE simulator's system-event log, as a log sink) and {TICK_TOPIC} "
            "(a tick a second, as Cloud Scheduler)",
            f"load-balancer pools: the agents' /readyz on 127.0.0.1 ({readyz})",
            # The emulator stops with the demo: what is left to read afterwards is the export.
            f"audit log: {self.audit_export}, written at the end from the Firestore collection mbridge_audit, "
            "one record a line as `mbridge audit list` prints them",
            f"logs: {self.logs}/ (pubsub-emulator, firestore-emulator, functions-framework); agents and push "
            f"shim: {self.workdir / 'demo.log'}; agent state: {self.workdir / 'agents'}",
        ]

    # ---- stop

    def close(self) -> None:
        """Stop everything that was started, the last first (also after a failed start)."""
        self._cleanup.close()

    def _export_audit(self) -> None:
        assert self._audit_log is not None
        records = self._audit_log.query()
        with self.audit_export.open("w", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(audit_line(record)) + "\n")


def _restore_variable(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _quietly(what: str, action: Callable[[], object]) -> None:
    """Run one step of the clean-up; a failure is logged and the next steps still run."""
    try:
        action()
    except Exception:
        LOG.exception("could not %s", what)
