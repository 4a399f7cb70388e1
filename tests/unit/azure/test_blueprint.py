"""The Azure Functions app in-process: function_app.py's registration, the registered Service Bus
function called with func.ServiceBusMessage objects, and the settings it starts from.

The ports are the SQLite store (":memory:") and in-memory fakes of our own LoadBalancer and
CommandSender; one test sends through the real ServiceBusOperator onto a fake SDK client, to see
the command leave with SessionId = target VM.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest
from azure.functions.servicebus import ServiceBusMessage as HostMessage
from azure.servicebus import ServiceBusMessage as SdkMessage
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import function_app
from functions.azure_app import settings as names
from functions.azure_app.blueprint import DEPS, FUNCTION_NAME, handle_message
from functions.azure_app.commands import ServiceBusCommandSender
from functions.azure_app.settings import Settings, SettingsError
from functions.azure_app.wiring import DepsProvider
from functions.core.policy import Policy
from functions.core.ports import CommandSender
from functions.core.process import CLAIM_LEASE, Deps
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.commands import decode_command
from wire.envelope import Envelope, encode, envelope_for_event
from wire.errors import PermanentError, RetryableError
from wire.identity import TRUST_FILE_FORMAT, Identity, ReporterName
from wire.model import EventKind, EventSource, EventStatus, MaintenanceEvent
from wire.signing import generate_keypair, load_public_key, sign, verify
from wire.transports.servicebus import (
    ReceiverLike,
    ServiceBusOperator,
    ServiceBusSettings,
    body_bytes,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
SUBSCRIPTION = "6f1c2d9e-0000-4000-8000-00000000c0de"
SET = ("web-0", "web-1", "web-2")


# ---------------------------------------------------------------- the app over fakes of our ports


@dataclass
class App:
    store: SqliteStore
    balancer: FakeBalancer
    sender: RecordingSender

    def deps(self, sender: CommandSender | None = None) -> Deps:
        return Deps(
            store=self.store,
            balancer=self.balancer,
            sender=sender or self.sender,
            audit=self.store,
            policy=Policy(),
            verifier=ReporterName(),  # the sender is the reporter: trust is tested on its own
            monotonic=FakeClock().monotonic,
        )

    def deliver(self, body: bytes) -> None:
        """What the host does with a message: call the registered function with it."""
        with DEPS.overridden(self.deps()):
            registered_function()(func.ServiceBusMessage(body=body, content_type="application/cloudevents+json"))


@pytest.fixture
def app() -> Iterator[App]:
    store = SqliteStore(":memory:")
    yield App(store, FakeBalancer({"web": SET}), RecordingSender())
    store.close()


@functools.cache
def indexed_functions() -> list[Any]:
    """What the host's indexing sees. Once: the library refuses to index an app twice (it takes
    the second pass for duplicate function names)."""
    return list(function_app.app.get_functions())


def registered_function() -> Any:
    (function,) = indexed_functions()
    return function.get_user_function()


def reboot(status: EventStatus = EventStatus.SCHEDULED, **fields: Any) -> MaintenanceEvent:
    values: dict[str, Any] = {
        "kind": EventKind.REBOOT,
        "status": status,
        "reporter": "web-0",
        "resources": ("web-0",),
        "duration_seconds": -1,
        "not_before": NOW + timedelta(minutes=15),
        "event_id": "E-REBOOT",
    }
    values.update(fields)
    return azure_event(**values)


def message_body(event: MaintenanceEvent) -> bytes:
    return encode(envelope_for_event(event, NOW))


# ---------------------------------------------------------------- registration


def test_function_app_registers_exactly_the_service_bus_topic_function() -> None:
    # GIVEN the app the Functions host indexes
    # WHEN its functions are built
    functions = indexed_functions()

    # THEN there is one, with one topic trigger reading its names from app settings
    assert [f.get_function_name() for f in functions] == [FUNCTION_NAME]
    (function,) = functions
    assert json.loads(function.get_function_json()) == {
        "scriptFile": "function_app.py",
        "bindings": [
            {
                "direction": "IN",
                "type": "serviceBusTrigger",
                "name": "msg",
                "connection": "MBRIDGE_SERVICEBUS",
                "topicName": "%MBRIDGE_EVENTS_TOPIC%",
                "subscriptionName": "%MBRIDGE_EVENTS_SUBSCRIPTION%",
                "cardinality": "ONE",
            }
        ],
    }


# ---------------------------------------------------------------- messages through the registered function


def test_a_scheduled_reboot_drains_its_vms_and_sends_one_approval(app: App) -> None:
    # GIVEN a message of a platform Reboot of web-0, due in 15 minutes
    # (the registered function runs on the wall clock: the host gives it no other)
    before = datetime.now(timezone.utc)
    event = reboot(not_before=before + timedelta(minutes=15))

    # WHEN the host delivers it
    app.deliver(message_body(event))

    # THEN web-0 left the pool and its agent got an approval after the drain period
    after = datetime.now(timezone.utc)
    assert app.balancer.members("web") == ["web-1", "web-2"]
    (approval,) = app.sender.commands
    assert (approval.type.value, approval.target, approval.event_id) == ("approve", "web-0", "E-REBOOT")
    assert approval.execute_at is not None
    drain_period = timedelta(seconds=30)
    # (commands carry milliseconds)
    assert before + drain_period - timedelta(milliseconds=1) <= approval.execute_at <= after + drain_period


def test_a_duplicate_message_is_acknowledged_without_acting_again(app: App) -> None:
    # GIVEN a message processed once
    app.deliver(message_body(reboot()))

    # WHEN the same envelope arrives again
    app.deliver(message_body(reboot()))
    outcome = handle_message(message_body(reboot()), app.deps(), NOW + timedelta(minutes=1))

    # THEN the function returns (the host completes the message), and nothing more was sent
    assert outcome.result == "duplicate"
    assert len(app.sender.commands) == 1
    assert [r.kind for r in app.store.query(event_id="E-REBOOT")].count("duplicate") == 2


def test_a_transient_failure_raises_so_the_message_is_redelivered(app: App) -> None:
    # GIVEN the load balancer API timing out on the first drain
    app.balancer.fail("remove", RetryableError("ARM answered 503; retry later"))

    # WHEN the host delivers the message
    # THEN the function raises (the host abandons it) and nothing was approved
    with pytest.raises(RetryableError, match="503"):
        app.deliver(message_body(reboot()))
    assert app.sender.commands == []

    # ... and the redelivery after the claim's lease completes the work once
    later = datetime.now(timezone.utc) + CLAIM_LEASE + timedelta(seconds=1)
    assert handle_message(message_body(reboot()), app.deps(), later).result == "processed"
    assert app.balancer.members("web") == ["web-1", "web-2"]
    assert len(app.sender.commands) == 1


def test_a_malformed_body_is_audited_and_acknowledged(app: App) -> None:
    # GIVEN a message that is no CloudEvent
    # WHEN the host delivers it
    app.deliver(b'{"specversion": "0.3", "data": "not ours"}')

    # THEN the function returns (no endless redelivery) and the audit log says why
    (record,) = app.store.query()
    assert (record.kind, record.action) == ("malformed", "none")
    assert record.reason
    assert app.sender.commands == []


def test_a_deployment_error_raises_to_keep_the_message(app: App) -> None:
    # GIVEN an identity without the role to change the load balancer
    app.balancer.fail("remove", PermanentError("not authorised to drain web-0: grant the role"))

    # WHEN the host delivers the message
    # THEN it raises: the message stays on the bus (dead-lettered at worst) for a resubmission
    with pytest.raises(PermanentError, match="grant the role"):
        app.deliver(message_body(reboot()))


def test_log_lines_stay_a_few_kib_whatever_the_error_or_the_event(app: App, caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN a load balancer whose error quotes 100,000 characters of its answer, and an event of
    # 1,000 VMs
    app.balancer.fail("remove", PermanentError("ARM refused: " + "a" * 100_000))
    vms = tuple(f"vmss-web_{n}" for n in range(1000))
    many = reboot(event_id="E-MANY", reporter=vms[0], resources=vms)
    caplog.set_level(logging.INFO, logger="mbridge.functions.azure")

    # WHEN both are delivered
    with pytest.raises(PermanentError):
        app.deliver(message_body(reboot()))
    app.deliver(message_body(many))

    # THEN each log line says what happened in at most a few KiB (the error's is cut; the event's
    # names the one VM its report moved)
    lines = [record.getMessage() for record in caplog.records if record.name == "mbridge.functions.azure"]
    assert len(lines) == 2
    assert all(len(line) <= 2200 for line in lines), [len(line) for line in lines]
    assert "more characters cut" in lines[0]
    assert "vmss-web_0" in lines[1]
    assert "vmss-web_1" not in lines[1]


def test_the_approval_leaves_on_the_commands_queue_in_the_target_vms_session(app: App) -> None:
    # GIVEN the real Service Bus sender over an SDK client that records what it is asked to send
    client = RecordingClient()
    operator = ServiceBusOperator(
        ServiceBusSettings(namespace="mybus.servicebus.windows.net", commands_queue="maintenance-commands"),
        client_factory=lambda _: client,
    )

    # WHEN a user-initiated Redeploy is handled (drain, then approve at once)
    event = reboot(kind=EventKind.REDEPLOY, event_source=EventSource.USER)
    handle_message(message_body(event), app.deps(sender=ServiceBusCommandSender(operator)), NOW)

    # THEN one message went to the queue, in web-0's session, with the command_id as MessageId
    (sent,) = client.sent["maintenance-commands"]
    command = decode_command(body_bytes(sent.body)).command
    assert (sent.session_id, sent.message_id) == ("web-0", command.command_id)
    assert (command.type.value, command.target) == ("approve", "web-0")


# ---------------------------------------------------------------- when the bus took the message


@dataclass
class RecordingVerifier:
    """Takes every sender at its word, and records the time each proof was checked as of."""

    accepted: list[datetime] = field(default_factory=list)

    def verify(self, envelope: Envelope, accepted_at: datetime, now: datetime) -> Identity:
        self.accepted.append(accepted_at)
        return Identity(vm=envelope.source.rsplit("/", 1)[-1], how="attested")


ENQUEUED = datetime(2026, 3, 1, 11, 58, 30, 250000, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "enqueued",
    [ENQUEUED, ENQUEUED.replace(tzinfo=None), ENQUEUED.astimezone(timezone(timedelta(hours=2)))],
    ids=["utc", "without-offset", "with-offset"],
)
def test_the_senders_proof_is_checked_as_of_when_service_bus_took_the_message(app: App, enqueued: datetime) -> None:
    # GIVEN a message Service Bus enqueued at 11:58:30.25 UTC (the host passes the time as it parsed it)
    verifier = RecordingVerifier()
    message = HostMessage(
        body=message_body(reboot()),
        enqueued_time_utc=enqueued,
        message_id="m-1",
        application_properties={},
        user_properties={},
    )

    # WHEN the host delivers it
    with DEPS.overridden(replace(app.deps(), verifier=verifier)):
        registered_function()(message)

    # THEN the proof was checked as of that time, in UTC
    assert verifier.accepted == [ENQUEUED]
    assert verifier.accepted[0].utcoffset() == timedelta(0)
    assert app.balancer.members("web") == ["web-1", "web-2"]


def test_without_an_enqueued_time_the_proof_is_checked_as_of_now(app: App) -> None:
    verifier = RecordingVerifier()
    before = datetime.now(timezone.utc)
    with DEPS.overridden(replace(app.deps(), verifier=verifier)):
        registered_function()(func.ServiceBusMessage(body=message_body(reboot())))
    (accepted,) = verifier.accepted
    assert before <= accepted <= datetime.now(timezone.utc)


# ---------------------------------------------------------------- worker lifetime


def test_deps_are_built_once_per_worker_and_a_failed_build_is_tried_again() -> None:
    # GIVEN a builder that fails the first time (a role assignment not yet effective)
    builds: list[int] = []

    def build() -> Deps:
        builds.append(len(builds) + 1)
        if len(builds) == 1:
            raise RetryableError("Table Storage is not reachable yet")
        store = SqliteStore(":memory:")
        return Deps(
            store,
            FakeBalancer({"web": SET}),
            RecordingSender(),
            store,
            Policy(),
            verifier=ReporterName(),
            monotonic=FakeClock().monotonic,
        )

    provider = DepsProvider(build)

    # WHEN three invocations ask for the deps
    with pytest.raises(RetryableError):
        provider.get()
    first, second = provider.get(), provider.get()

    # THEN the second invocation built them, and the third reused them
    assert first is second
    assert builds == [1, 2]


# ---------------------------------------------------------------- settings

MINIMAL = {
    names.EVENTS_TOPIC: "maintenance-events",
    names.EVENTS_SUBSCRIPTION: "functions",
    names.SERVICEBUS_NAMESPACE: "mybus.servicebus.windows.net",
    names.TABLE_ENDPOINT: "https://myaccount.table.core.windows.net",
    names.TRUST_SUBSCRIPTIONS: SUBSCRIPTION,
    names.TRUST_RESOURCE_GROUPS: "rg-web",
}


def certificate_pem(name: str) -> str:
    """A self-signed CA certificate, as PEM text."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - timedelta(days=1))
        .not_valid_after(NOW + timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode("ascii")


def common_names(certificates: tuple[x509.Certificate, ...]) -> list[str]:
    return [str(c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value) for c in certificates]


def test_minimal_settings_take_the_documented_defaults() -> None:
    # GIVEN only the required app settings
    # WHEN they are read
    settings = Settings.from_env(MINIMAL)

    # THEN the defaults apply: no load balancer, drains through /readyz, default tables and policy
    assert settings.commands_queue == "maintenance-commands"
    assert (settings.state_table, settings.audit_table) == ("mbridgestate", "mbridgeaudit")
    assert settings.load_balancer is None
    assert settings.readiness_drain is True
    assert settings.policy == Policy()
    assert settings.signing_key is None
    assert settings.trust_resource_groups == ("rg-web",)
    # ... and attested documents are verified against Azure's roots (certifi's and the shipped
    # Microsoft TLS RSA Root G2), signed for metadata.azure.com, from the given subscription
    assert settings.trust_file is None
    assert sorted(common_names(settings.trust_roots)) == [
        "DigiCert Global Root G2",
        "DigiCert Global Root G3",
        "Microsoft ECC Root Certificate Authority 2017",
        "Microsoft RSA Root Certificate Authority 2017",
        "Microsoft TLS RSA Root G2",
    ]
    assert settings.trust_intermediates == ()
    assert settings.trust_signer_names == ("metadata.azure.com",)
    assert settings.trust_subscriptions == (SUBSCRIPTION,)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({names.EVENTS_TOPIC: ""}, "MBRIDGE_EVENTS_TOPIC is not set"),
        ({names.SERVICEBUS_NAMESPACE: None}, "exactly one of MBRIDGE_SERVICEBUS__fullyQualifiedNamespace"),
        ({names.SERVICEBUS_CONNECTION: "Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=s"}, "exactly one of"),
        ({names.SERVICEBUS_NAMESPACE: "mybus"}, "fully qualified namespace"),
        ({names.TABLE_CONNECTION_STRING: "UseDevelopmentStorage=true"}, "exactly one of MBRIDGE_TABLE_ENDPOINT"),
        ({names.TABLE_ENDPOINT: "myaccount"}, "MBRIDGE_TABLE_ENDPOINT is a URL"),
        ({names.STATE_TABLE: "maintenance-state"}, "MBRIDGE_STATE_TABLE='maintenance-state' is not a Table"),
        ({names.LB_NAME: "lb-web"}, "MBRIDGE_LB_SUBSCRIPTION_ID, MBRIDGE_LB_RESOURCE_GROUP not set"),
        ({names.READINESS_DRAIN: "maybe"}, "MBRIDGE_READINESS_DRAIN is true or false"),
        ({names.POLICY: '{"drain_period": 10}'}, "MBRIDGE_POLICY: unknown policy setting 'drain_period'"),
        ({names.SIGNING_KEY: "not-a-key"}, "MBRIDGE_SIGNING_KEY: the key is neither PEM"),
        (
            {
                names.SIGNING_KEY: "@Microsoft.KeyVault(SecretUri=https://kv-x.vault.azure.net/secrets/commands-signing-key)"
            },
            "MBRIDGE_SIGNING_KEY: the Key Vault reference was not resolved",
        ),
        (
            {names.TRUST_RESOURCE_GROUPS: "rg-vms,/subscriptions/x/resourceGroups/rg-db"},
            "MBRIDGE_TRUST_RESOURCE_GROUPS: '/subscriptions/x/resourceGroups/rg-db' is not a resource group name",
        ),
        ({names.TRUST_RESOURCE_GROUPS: "rg-vms."}, "MBRIDGE_TRUST_RESOURCE_GROUPS: 'rg-vms.' is not a resource group"),
        ({names.TRUST_RESOURCE_GROUPS: "rg vms"}, "MBRIDGE_TRUST_RESOURCE_GROUPS: 'rg vms' is not a resource group"),
        ({names.TRUST_SUBSCRIPTIONS: None}, "MBRIDGE_TRUST_SUBSCRIPTIONS is not set"),
        ({names.TRUST_SUBSCRIPTIONS: " "}, "MBRIDGE_TRUST_SUBSCRIPTIONS is not set"),
        ({names.TRUST_SUBSCRIPTIONS: ","}, "MBRIDGE_TRUST_SUBSCRIPTIONS names no subscription"),
        (
            {names.TRUST_SUBSCRIPTIONS: f"{SUBSCRIPTION},/subscriptions/{SUBSCRIPTION}"},
            f"MBRIDGE_TRUST_SUBSCRIPTIONS: '/subscriptions/{SUBSCRIPTION}' is not a subscription id",
        ),
        ({names.TRUST_ROOTS: "/nonexistent/roots.pem"}, "MBRIDGE_TRUST_ROOTS: cannot read '/nonexistent/roots.pem'"),
        (
            {names.TRUST_ROOTS: "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"},
            "MBRIDGE_TRUST_ROOTS: the PEM text is not PEM certificates",
        ),
        ({names.TRUST_INTERMEDIATES: "/nonexistent/ca.pem"}, "MBRIDGE_TRUST_INTERMEDIATES: cannot read"),
        ({names.TRUST_SIGNER_NAMES: "https://metadata.azure.com"}, "MBRIDGE_TRUST_SIGNER_NAMES: 'https://metadata"),
        ({names.TRUST_SIGNER_NAMES: "metadata azure com"}, "MBRIDGE_TRUST_SIGNER_NAMES: 'metadata azure com' is not"),
        ({names.TRUST_FILE: "/nonexistent/trust.json"}, "MBRIDGE_TRUST_FILE: cannot read the trust file"),
    ],
)
def test_a_wrong_setting_is_named_in_the_error(change: dict[str, str | None], message: str) -> None:
    # GIVEN the minimal settings with one setting wrong
    environ = {**MINIMAL, **change}
    clean = {key: value for key, value in environ.items() if value is not None}

    # WHEN they are read
    # THEN the error names the setting
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(clean)


def test_a_full_configuration_is_read_and_keeps_secrets_out_of_its_repr() -> None:
    # GIVEN every setting, with connection strings and a signing key
    private_pem, public_pem = generate_keypair()
    environ = {
        names.EVENTS_TOPIC: "maintenance-events",
        names.EVENTS_SUBSCRIPTION: "functions",
        names.SERVICEBUS_CONNECTION: "Endpoint=sb://mybus.servicebus.windows.net/;SharedAccessKeyName=k;"
        "SharedAccessKey=sb-secret",
        names.TABLE_CONNECTION_STRING: "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=table-secret",
        names.COMMANDS_QUEUE: "commands",
        names.LB_SUBSCRIPTION_ID: "00000000-0000-0000-0000-000000000000",
        names.LB_RESOURCE_GROUP: "rg-net",
        names.LB_NAME: "lb-web",
        names.LB_NIC_RESOURCE_GROUP: "rg-vms",
        names.READINESS_DRAIN: "false",
        names.POLICY: '{"default_max_drained": 1, "drain_period_seconds": 45}',
        names.SIGNING_KEY: private_pem.decode(),
        names.TRUST_RESOURCE_GROUPS: " rg-vms, RG-VMS ,rg-batch(2).eu,",
    }

    # WHEN it is read
    settings = Settings.from_env(environ)

    # THEN every value is taken, the key signs verifiably, and no secret shows in logs
    assert settings.load_balancer is not None
    assert (settings.load_balancer.resource_group, settings.load_balancer.nic_resource_group) == ("rg-net", "rg-vms")
    assert (settings.readiness_drain, settings.commands_queue) == (False, "commands")
    assert (settings.policy.default_max_drained, settings.policy.drain_period_seconds) == (1, 45)
    assert settings.trust_resource_groups == ("rg-vms", "rg-batch(2).eu")  # each group once, in the given order
    assert settings.signing_key is not None
    verify(b"payload", sign(b"payload", settings.signing_key), load_public_key(public_pem))
    for secret in ("sb-secret", "table-secret", "PRIVATE KEY"):
        assert secret not in repr(settings)


def test_trust_settings_are_read_from_pem_text_or_files(tmp_path: Path) -> None:
    # GIVEN two roots as PEM text written on one line (as an app setting may hold them), an
    # intermediate as a file, regional signer names and subscriptions in any case
    roots = certificate_pem("Root One") + certificate_pem("Root Two")
    intermediate = tmp_path / "intermediate.pem"
    intermediate.write_text(certificate_pem("Issuing CA"), encoding="ascii")
    other = "0A1B2C3D-0000-4000-8000-000000000001"
    environ = {
        **MINIMAL,
        names.TRUST_ROOTS: roots.replace("\n", "\\n"),
        names.TRUST_INTERMEDIATES: str(intermediate),
        names.TRUST_SIGNER_NAMES: " Metadata.Azure.com, eastus.metadata.azure.com ,metadata.azure.com,",
        names.TRUST_SUBSCRIPTIONS: f"{SUBSCRIPTION.upper()}, {other}, {SUBSCRIPTION}",
    }

    # WHEN they are read
    settings = Settings.from_env(environ)

    # THEN each value is taken as given, names and ids in lower case and once each
    assert common_names(settings.trust_roots) == ["Root One", "Root Two"]
    assert common_names(settings.trust_intermediates) == ["Issuing CA"]
    assert settings.trust_signer_names == ("metadata.azure.com", "eastus.metadata.azure.com")
    assert settings.trust_subscriptions == (SUBSCRIPTION, other.lower())


def test_the_trusted_subscription_defaults_to_the_load_balancers() -> None:
    # GIVEN no trusted subscriptions, and a load balancer (the VMs behind it are in its subscription)
    environ = {key: value for key, value in MINIMAL.items() if key != names.TRUST_SUBSCRIPTIONS}
    environ.update({names.LB_SUBSCRIPTION_ID: SUBSCRIPTION.upper(), names.LB_RESOURCE_GROUP: "rg", names.LB_NAME: "lb"})

    # WHEN they are read THEN the load balancer's subscription is trusted
    assert Settings.from_env(environ).trust_subscriptions == (SUBSCRIPTION,)


@pytest.mark.parametrize(
    "change",
    [{names.POLICY: '{"trust": "reporter-name"}'}, {names.TRUST_FILE: "trust.json"}],
    ids=["reporter-name", "trust-file"],
)
def test_without_attested_documents_to_check_no_subscription_or_root_is_needed(
    change: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN trust reporter-name, or a trust file (which says itself what it trusts)
    monkeypatch.chdir(tmp_path)
    Path("trust.json").write_text(json.dumps({"format": TRUST_FILE_FORMAT}), encoding="utf-8")
    environ = {key: value for key, value in MINIMAL.items() if key != names.TRUST_SUBSCRIPTIONS}

    # WHEN the settings are read without trusted subscriptions
    settings = Settings.from_env({**environ, **change})

    # THEN nothing is missing, and no root was looked for
    assert (settings.trust_roots, settings.trust_subscriptions) == ((), ())


# ---------------------------------------------------------------- a fake of the Service Bus SDK client


@dataclass
class _QueueSender:
    queue: list[SdkMessage]

    def send_messages(self, message: SdkMessage, *, timeout: float | None = None) -> None:
        self.queue.append(message)

    def create_message_batch(self) -> object:
        return object()

    def close(self) -> None:
        pass


@dataclass
class RecordingClient:
    """The ServiceBusClient surface ServiceBusOperator sends with; receiving is not expected here."""

    sent: dict[str, list[SdkMessage]] = field(default_factory=dict)

    def get_queue_sender(self, queue_name: str) -> _QueueSender:
        return _QueueSender(self.sent.setdefault(queue_name, []))

    def get_topic_sender(self, topic_name: str) -> _QueueSender:
        raise AssertionError("the function app publishes nothing on the events topic")

    def get_queue_receiver(self, queue_name: str, *, session_id: str | None = None) -> ReceiverLike:
        raise AssertionError("the function app receives no commands")

    def get_subscription_receiver(self, topic_name: str, subscription_name: str) -> ReceiverLike:
        raise AssertionError("the function app reads no command results")

    def close(self) -> None:
        pass
