"""The Google backbone of the demo: Google's Pub/Sub and Firestore emulators, and the Cloud
Functions entry (`main.py`: `on_maintenance_event`) served by functions-framework on loopback.

    agents ─► maintenance-events ─► push subscription ─► EventarcShim ─► functions-framework
                    │                 (as Eventarc's)     (CloudEvent)     on_maintenance_event
                    └─► demo-observer (pull): what the demo sees                │
    agents ◄─ maintenance-commands-<vm> ◄─ maintenance-commands ◄──────────────┤ drain/approve/restore
    demo ◄─ FirestoreAuditLog.query ◄─ Firestore emulator (state, audit) ◄─────┘

- The agents run in threads of this process, on the real Pub/Sub transport, each with its own
  commands subscription (the emulator accepts the `target` filter but ignores it: the agents
  drop other VMs' commands themselves) and a health port: a VM is in its load-balancer pool
  while its `/readyz` answers 200, which is what the function's `drain`/`restore` commands flip
  (ReadinessBalancer; no instance groups are configured).
- Eventarc delivers a Pub/Sub message to a gen2 function as a binary-mode CloudEvent of type
  `google.cloud.pubsub.topic.v1.messagePublished` whose data is `{"message", "subscription"}`.
  The emulator's push subscription POSTs the bare `{"message", "subscription"}` instead, so a
  small loopback HTTP server, `EventarcShim`, adds the CloudEvent headers, forwards the POST to
  functions-framework and answers the emulator with the function's status: a non-2xx answer
  makes the emulator redeliver, as Pub/Sub does for Eventarc. (The emulator redelivers about a
  second later and keeps two pushes in flight per subscription; Pub/Sub backs off from 10 s and
  pushes many at once.)
- The demo sees envelopes through a pull subscription of its own on the events topic (Pub/Sub's
  publish time is the "published" stage), the audit log through `FirestoreAuditLog.query`, and
  approvals through the simulators. At the end the audit log is written to `audit.jsonl` in the
  work dir, one record a line, as `mbridge audit list` prints them.

Every process is started in a process group of its own and stopped in `close()`, which also
undoes a start that failed half way.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import fields
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import requests

from functions.core.policy import Policy, PolicyError, load_policy
from functions.core.ports import AuditRecord
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
    launch,
    launch_emulator,
    wait_ready,
)
from mbridge.demo.errors import DemoSetupError
from mbridge.demo.flows import AZURE_VMS, GCE_VM, POOLS
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
    from functions.gcp_app.firestore_store import FirestoreAuditLog

LOG = logging.getLogger("mbridge.demo.pubsub")

PROJECT = "mbridge-demo"
EVENTS_TOPIC = "maintenance-events"
COMMANDS_TOPIC = "maintenance-commands"
# Eventarc names the push subscription of a trigger eventarc-REGION-TRIGGER-sub-NNN.
TRIGGER_SUBSCRIPTION = "eventarc-local-mbridge-events-sub-000"
OBSERVER_SUBSCRIPTION = "demo-observer"
FUNCTION_TARGET = "on_maintenance_event"
MESSAGE_PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"
PUBSUB_SOURCE = "//pubsub.googleapis.com/"
PUBSUB_MESSAGE_TYPE = "type.googleapis.com/google.pubsub.v1.PubsubMessage"
# How long the function may take for one message before the push is given up and redelivered
# (a delivery that meets a claim held by another invocation waits for it).
PUSH_ACK_DEADLINE = 60
FUNCTION_STARTUP_TIMEOUT = 60.0
ADMIN_TIMEOUT = 10.0
AUDIT_INTERVAL = 0.1
PULL_IDLE = 0.05
READYZ_TIMEOUT = 2.0
REPO_ROOT = Path(__file__).resolve().parents[2]
GCP_EXTRA_HINT = "install the Google extras: pip install -e '.[gcp]' (from the repository root)"


def policy_document(policy: Policy) -> str:
    """`policy` as the JSON document MBRIDGE_POLICY takes (docs/policy.md).

    Raises:
        DemoSetupError: the document would not read back as `policy`.
    """
    document: dict[str, Any] = {
        f.name: getattr(policy, f.name) for f in fields(Policy) if f.name not in ("pools", "maintenance_window_utc")
    }
    document["pools"] = {pool.name: {"vms": sorted(pool.vms), "max_drained": pool.max_drained} for pool in policy.pools}
    if policy.maintenance_window_utc is not None:
        document["maintenance_window_utc"] = list(policy.maintenance_window_utc)
    text = json.dumps(document, sort_keys=True)
    try:
        same = load_policy(text) == policy
    except PolicyError as exc:
        raise DemoSetupError(f"the demo's policy cannot be passed to the function: {exc}") from exc
    if not same:
        raise DemoSetupError(f"the demo's policy does not survive MBRIDGE_POLICY: {text}")
    return text


def eventarc_request(push: Mapping[str, Any], topic: str) -> tuple[dict[str, str], bytes]:
    """The binary-mode CloudEvent Eventarc would POST to the function for a Pub/Sub push body
    `{"message": {...}, "subscription": "projects/P/subscriptions/S"}` of `topic` (a full path).

    Raises:
        ValueError: `push` is not a Pub/Sub push body.
    """
    message = push.get("message")
    if not isinstance(message, Mapping) or not isinstance(push.get("subscription"), str):
        raise ValueError("not a Pub/Sub push body: expected {'message': {...}, 'subscription': '...'}")
    message_id = message.get("messageId") or message.get("message_id")
    if not isinstance(message_id, str) or not message_id:
        raise ValueError("the pushed message has no messageId")
    headers = {
        "ce-specversion": "1.0",
        "ce-id": message_id,
        "ce-source": PUBSUB_SOURCE + topic,
        "ce-type": MESSAGE_PUBLISHED,
        "Content-Type": "application/json; charset=utf-8",
    }
    published = message.get("publishTime") or message.get("publish_time")
    if isinstance(published, str) and published:
        headers["ce-time"] = published
    delivered = {"@type": PUBSUB_MESSAGE_TYPE, **message}
    body = json.dumps({"message": delivered, "subscription": push["subscription"]}).encode()
    return headers, body


class EventarcShim:
    """A loopback HTTP server standing in for Eventarc: takes the emulator's push POSTs and
    forwards each to the function as a messagePublished CloudEvent; the function's status is the
    answer (2xx acknowledges, anything else makes the emulator redeliver)."""

    def __init__(self, function_url: str, topic: str, timeout: float = PUSH_ACK_DEADLINE) -> None:
        self.function_url = function_url
        self.topic = topic
        self.timeout = timeout
        self.delivered = Counter[int]()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="eventarc-shim", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/"

    def start(self) -> EventarcShim:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def forward(self, payload: bytes) -> tuple[int, bytes]:
        """Deliver one push body to the function; (status, body) to answer the emulator with."""
        try:
            headers, body = eventarc_request(json.loads(payload), self.topic)
        except ValueError as exc:  # JSONDecodeError is one
            LOG.error("push shim: refused a push that is not a Pub/Sub message: %s", exc)
            return 400, str(exc).encode()
        started = time.monotonic()
        try:
            response = requests.post(self.function_url, data=body, headers=headers, timeout=self.timeout)
        except requests.RequestException as exc:
            LOG.warning("push shim: message %s not delivered, the emulator will redeliver: %s", headers["ce-id"], exc)
            status, answer = 502, f"the function did not answer: {exc}".encode()
        else:
            status, answer = response.status_code, response.content
            took = (time.monotonic() - started) * 1000
            if 200 <= status < 300:
                LOG.info("push shim: message %s → function %d in %.0f ms", headers["ce-id"], status, took)
            else:
                LOG.warning(
                    "push shim: message %s → function %d in %.0f ms, the emulator will redeliver: %s",
                    headers["ce-id"], status, took, answer[:300].decode(errors="replace"),
                )  # fmt: skip
        with self._lock:
            self.delivered[status] += 1
        return status, answer

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        shim = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "mbridge-eventarc-shim"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                status, answer = shim.forward(self.rfile.read(length))
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                return  # forward() logs every delivery

        return Handler


class PubSubWorld:
    """The demo on Google's emulators and the Cloud Functions entry (see the module docstring)."""

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
        self.shim: EventarcShim | None = None
        self.sims: Simulators | None = None
        self.health: dict[str, str] = {}  # VM → base URL of its agent's health server
        self._cleanup = ExitStack()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._envelopes: list[tuple[bytes, datetime]] = []
        self._audit: list[AuditRecord] = []
        self._audit_told = Counter[AuditRecord]()
        self._approvals_seen = 0
        self._subscriber: Any = None  # the Pub/Sub admin client, also the observer's puller
        self._audit_log: FirestoreAuditLog | None = None

    # ---- start

    def start(self, timeout: float = 15.0) -> PubSubWorld:
        """Start everything; on any failure what was started is stopped by `close()`.

        Raises:
            DemoSetupError: an emulator, Java or the Google libraries are missing, or a process did not start.
        """
        _require_google_libraries()
        policy = policy_document(self.policy)
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
        self.pubsub = self._started(launch_emulator(PUBSUB, self.logs, sdk_root))
        self.firestore = self._started(launch_emulator(FIRESTORE, self.logs, sdk_root))
        self.function = self._started(self._launch_function(policy))
        wait_ready(self.pubsub, PUBSUB.ready_text)
        wait_ready(self.firestore, FIRESTORE.ready_text)
        self._point_clients_at_emulators()
        wait_ready(self.function, accepts_connections(self.function.host), FUNCTION_STARTUP_TIMEOUT)
        self.shim = EventarcShim(self.function_url, _topic(EVENTS_TOPIC)).start()
        self._cleanup.callback(self.shim.stop)
        self._create_bus()
        self._start_watching()
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

    def _launch_function(self, policy: str) -> PeerProcess:
        assert self.pubsub is not None
        assert self.firestore is not None
        port = free_port()
        # Nothing of the caller's own MBRIDGE_* settings (instance groups, a signing key) leaks in.
        env = {name: value for name, value in os.environ.items() if not name.startswith("MBRIDGE_")}
        env.update(
            {
                "MBRIDGE_GCP_PROJECT": PROJECT,
                "MBRIDGE_PUBSUB_COMMANDS_TOPIC": COMMANDS_TOPIC,
                "MBRIDGE_READINESS_DRAIN": "true",
                "MBRIDGE_POLICY": policy,
                "MBRIDGE_TRUST_FILE": str(self.trust_file),
                "MBRIDGE_SIGNING_KEY": self.commands.private_pem.decode("ascii"),
                PUBSUB.variable: self.pubsub.host,
                FIRESTORE.variable: self.firestore.host,
                "PYTHONUNBUFFERED": "1",
            }
        )
        command = [
            sys.executable, "-m", "functions_framework",
            "--target", FUNCTION_TARGET, "--signature-type", "cloudevent", "--source", str(REPO_ROOT / "main.py"),
            "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip
        return launch("functions-framework", command, f"127.0.0.1:{port}", self.logs, env=env, cwd=REPO_ROOT)

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
        import google.cloud.pubsub_v1 as pubsub_v1  # type: ignore[import-untyped]  # the library ships no py.typed

        assert self.shim is not None
        publisher = self._publisher = pubsub_v1.PublisherClient()
        subscriber = pubsub_v1.SubscriberClient()
        self._cleanup.callback(_quietly, "close the Pub/Sub admin clients", subscriber.close)
        with _setting_up("create the Pub/Sub topics and subscriptions on the emulator"):
            for topic in (EVENTS_TOPIC, COMMANDS_TOPIC):
                publisher.create_topic(name=_topic(topic), timeout=ADMIN_TIMEOUT)
            subscriptions: list[dict[str, Any]] = [
                {"name": OBSERVER_SUBSCRIPTION, "topic": EVENTS_TOPIC},
                {
                    "name": TRIGGER_SUBSCRIPTION,
                    "topic": EVENTS_TOPIC,
                    "push_config": {"push_endpoint": self.shim.url},
                    "ack_deadline_seconds": PUSH_ACK_DEADLINE,
                },
                *(
                    {"name": f"{COMMANDS_TOPIC}-{vm}", "topic": COMMANDS_TOPIC, "filter": f'attributes.target = "{vm}"'}
                    for vm in (*AZURE_VMS, GCE_VM)
                ),
            ]
            for request in subscriptions:
                subscriber.create_subscription(
                    request={**request, "name": _subscription(request["name"]), "topic": _topic(request["topic"])},
                    timeout=ADMIN_TIMEOUT,
                )
        self._subscriber = subscriber

    # ---- what the demo watches

    def _start_watching(self) -> None:
        from google.cloud import firestore

        from functions.gcp_app.firestore_store import FirestoreAuditLog

        audit_log = FirestoreAuditLog(firestore.Client(project=PROJECT))
        self._audit_log = audit_log
        self._cleanup.callback(_quietly, "export the audit log", self._export_audit)
        threads = [
            threading.Thread(target=self._pull_envelopes, name="demo-observer", daemon=True),
            threading.Thread(target=self._read_audit, name="demo-audit", daemon=True),
        ]
        for thread in threads:
            thread.start()

        def stop_watching() -> None:
            self._stop.set()
            for thread in threads:
                thread.join(timeout=10)

        self._cleanup.callback(stop_watching)

    def _pull_envelopes(self) -> None:
        from google.api_core import exceptions as api_errors

        subscription = _subscription(OBSERVER_SUBSCRIPTION)
        while not self._stop.is_set():
            try:
                response = self._subscriber.pull(subscription=subscription, max_messages=100, timeout=1.0, retry=None)
                received = list(response.received_messages)
                if received:
                    ack_ids = [item.ack_id for item in received]
                    self._subscriber.acknowledge(subscription=subscription, ack_ids=ack_ids, timeout=ADMIN_TIMEOUT)
            except api_errors.DeadlineExceeded:
                continue
            except Exception:  # the emulator going away at the end, or a hiccup: try again
                if not self._stop.is_set():
                    LOG.exception("pulling from %s failed; retrying", subscription)
                self._stop.wait(0.5)
                continue
            with self._lock:
                self._envelopes.extend((bytes(item.message.data), item.message.publish_time) for item in received)
            if not received:
                self._stop.wait(PULL_IDLE)

    def _read_audit(self) -> None:
        assert self._audit_log is not None
        while not self._stop.is_set():
            try:
                records = list(self._audit_log.query())
            except Exception:
                if not self._stop.is_set():
                    LOG.exception("reading the audit log failed; retrying")
                self._stop.wait(0.5)
                continue
            with self._lock:
                self._audit = records
            self._stop.wait(AUDIT_INTERVAL)

    def _start_agents(self, sims: Simulators) -> None:
        agents = AgentThreads()
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
        with self._lock:
            envelopes, self._envelopes = self._envelopes, []
            records = list(self._audit)
        for body, published in sorted(envelopes, key=lambda item: item[1]):
            observer.envelope(body, published)
        # Records are told once each, whatever order the queries return them in.
        seen = Counter[AuditRecord]()
        for record in records:
            seen[record] += 1
            if seen[record] > self._audit_told[record]:
                self._audit_told[record] += 1
                observer.audit(record)
        assert self.sims is not None
        approvals = self.sims.approvals()
        for entry in approvals[self._approvals_seen :]:
            observer.approval(entry)
        self._approvals_seen = len(approvals)

    def pools(self) -> Mapping[str, Sequence[str]]:
        return {name: [vm for vm in vms if self._ready(vm)] for name, vms in POOLS.items()}

    def forge(self, by: str, body: bytes) -> None:
        assert self.sims is not None
        message = forged_message(self.sims.prover(by), by, body)
        attributes = {**message.attributes, "envelope_id": message.envelope_id}
        future = self._publisher.publish(_topic(EVENTS_TOPIC), message.body, **attributes)
        future.result(timeout=ADMIN_TIMEOUT)

    def sender_of(self, body: bytes) -> str | None:
        assert self._verifier is not None
        return sender_of(self._verifier, body)

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
            f"load-balancer pools: the agents' /readyz on 127.0.0.1 ({readyz})",
            f"audit log: Firestore collection mbridge_audit (FIRESTORE_EMULATOR_HOST={self.firestore.host}), "
            f"written to {self.audit_export} at the end",
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


def _topic(name: str) -> str:
    return f"projects/{PROJECT}/topics/{name}"


def _subscription(name: str) -> str:
    return f"projects/{PROJECT}/subscriptions/{name}"


def _require_google_libraries() -> None:
    missing = [
        module
        for module in ("functions_framework", "google.cloud.pubsub_v1", "google.cloud.firestore")
        if _missing(module)
    ]
    if missing:
        raise DemoSetupError(f"the Python packages of {', '.join(missing)} are not installed: {GCP_EXTRA_HINT}")
    if not (REPO_ROOT / "main.py").is_file():
        raise DemoSetupError(
            f"the Cloud Functions entry {REPO_ROOT / 'main.py'} is not there: run the demo from a checkout of the "
            "repository installed with pip install -e"
        )


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:  # a parent package is missing
        return True


@contextmanager
def _setting_up(what: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        raise DemoSetupError(f"could not {what}: {exc}") from exc


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
