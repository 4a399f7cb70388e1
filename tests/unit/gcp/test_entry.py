"""The Cloud Functions app around the core: its entry point called as Eventarc calls it (directly
with a CloudEvent, and over HTTP through the functions framework in both CloudEvents encodings),
and its settings, wiring, command sender and log lines.

Deps are the SQLite store and small fakes of our own ports, set through `wiring.override`.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import functions_framework
import pytest
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import compute_v1, firestore

from functions.core.log_fields import fields
from functions.core.policy import Policy
from functions.core.ports import ActionName, Result
from functions.core.process import Deps, Outcome, Taken
from functions.gcp_app import entry as entry_module
from functions.gcp_app import logging as logs
from functions.gcp_app import wiring
from functions.gcp_app.commands import PubSubCommandSender
from functions.gcp_app.compute import ComputeMaintenance, ComputeUnavailableError
from functions.gcp_app.entry import MESSAGE_PUBLISHED, handle_message, message_body, on_maintenance_event
from functions.gcp_app.firestore_audit import FirestoreAuditLog
from functions.gcp_app.firestore_store import FirestoreStateStore
from functions.gcp_app.settings import GroupRef, Settings, SettingsError
from functions.local_app.store import SqliteStore
from functions.trust.verifiers import CloudVerifier
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.commands import Command, CommandType, decode_command
from wire.envelope import Envelope, encode, envelope_for_command_result, envelope_for_event
from wire.errors import PermanentError, RetryableError
from wire.identity import DEFAULT_AUDIENCE, TRUST_FILE_FORMAT, Identity, ReporterName
from wire.model import Cloud, CommandResult, EventKind, EventStatus, MaintenanceEvent
from wire.shards import entity_for
from wire.signing import generate_keypair, load_public_key, verify

ROOT = Path(__file__).resolve().parents[3]
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
PROJECT = "shop-prod"
SUBSCRIPTION = f"projects/{PROJECT}/subscriptions/eventarc-europe-west1-mbridge-events-123-sub-456"


# ---------------------------------------------------------------- fakes of our ports


@dataclass
class World:
    store: SqliteStore
    balancer: FakeBalancer
    sender: RecordingSender
    deps: Deps

    def kinds(self) -> list[str]:
        return [record.kind for record in self.store.query()]


@pytest.fixture
def world() -> Iterator[World]:
    store = SqliteStore(":memory:")
    balancer, sender = FakeBalancer({"web": ["web-0", "web-1", "web-2"]}), RecordingSender()
    # The sender is the reporter: trust is tested on its own.
    deps = Deps(
        store=store,
        balancer=balancer,
        sender=sender,
        audit=store,
        policy=Policy(),
        verifier=ReporterName(),
        monotonic=FakeClock().monotonic,
    )
    with wiring.override(deps):
        yield World(store, balancer, sender, deps)
    store.close()


def reboot(status: EventStatus = EventStatus.SCHEDULED) -> MaintenanceEvent:
    return azure_event(
        kind=EventKind.REBOOT,
        status=status,
        event_id="E-REBOOT",
        reporter="web-0",
        resources=("web-0",),
        duration_seconds=-1,
        not_before=NOW + timedelta(minutes=15),
    )


def body_of(event: MaintenanceEvent) -> bytes:
    return encode(envelope_for_event(event, NOW))


PUBLISHED_AT = "2026-03-01T12:00:00.481Z"


def published(
    data: bytes | str | None,
    message_id: str = "11223344556677",
    publish_time: object = PUBLISHED_AT,
    **attributes: str,
) -> CloudEvent:
    """A messagePublished CloudEvent as Eventarc delivers it for a Pub/Sub message with `data`
    (bytes are base64-encoded here; a str is sent as it is; None leaves `data` out) and
    `publish_time` (None leaves it out)."""
    message: dict[str, Any] = {
        "@type": "type.googleapis.com/google.pubsub.v1.PubsubMessage",
        "attributes": {"type": "org.maintenancebridge.maintenance.scheduled", "vm": "web-0", **attributes},
        "messageId": message_id,
        "message_id": message_id,
        "orderingKey": "web-0",
    }
    if publish_time is not None:
        message.update({"publishTime": publish_time, "publish_time": publish_time})
    if data is not None:
        message["data"] = base64.b64encode(data).decode() if isinstance(data, bytes) else data
    return CloudEvent(
        {
            "specversion": "1.0",
            "type": MESSAGE_PUBLISHED,
            "source": f"//pubsub.googleapis.com/projects/{PROJECT}/topics/maintenance-events",
            "id": message_id,
            "time": "2026-03-01T12:00:00.481Z",
            "datacontenttype": "application/json",
        },
        {"message": message, "subscription": SUBSCRIPTION},
    )


# ---------------------------------------------------------------- the entry point, called directly


def test_a_published_event_is_processed_and_acknowledged(world: World) -> None:
    # GIVEN a scheduled reboot of web-0 published on the events topic
    event = published(body_of(reboot()))
    # WHEN Eventarc delivers it THEN the function returns (acknowledged) having drained both VMs
    # and sent one approval to the reporter
    assert on_maintenance_event(event) is None
    assert world.balancer.drained == ["web-0"]
    assert [(c.type, c.target) for c in world.sender.commands] == [(CommandType.APPROVE, "web-0")]
    assert world.kinds()[:2] == ["event", "decision"]


def test_a_redelivered_event_is_acknowledged_without_acting_again(world: World) -> None:
    on_maintenance_event(published(body_of(reboot()), message_id="1"))
    on_maintenance_event(published(body_of(reboot()), message_id="2"))  # another reporter or a redelivery
    assert world.balancer.drained == ["web-0"]
    assert len(world.sender.commands) == 1
    assert world.kinds()[-1] == "duplicate"


def test_a_transient_failure_fails_the_invocation_so_pubsub_redelivers(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.balancer.fail("remove", RetryableError("the instance groups API timed out"), times=None)
    with pytest.raises(RetryableError, match="timed out"):
        on_maintenance_event(published(body_of(reboot()), message_id="77"))
    warning = next(r for r in caplog.records if r.name == "mbridge.gcp.entry")
    assert (warning.levelname, getattr(warning, "labels", {})) == ("WARNING", {"message_id": "77"})


def test_a_configuration_failure_of_an_adapter_also_fails_the_invocation(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN an adapter that lacks a role: the event was not acted on, so it must not be acknowledged
    world.balancer.fail("remove", PermanentError("not allowed to remove web-0 from instance group web-b"), times=None)
    with pytest.raises(PermanentError):
        on_maintenance_event(published(body_of(reboot())))
    assert any("dead-letter topic" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")


def test_an_adapter_error_of_any_size_is_logged_in_a_few_kib(world: World, caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN an adapter whose error quotes 100,000 characters of an API's answer
    world.balancer.fail("remove", PermanentError("the API refused: " + "a" * 100_000), times=None)

    # WHEN the message is delivered
    with pytest.raises(PermanentError):
        on_maintenance_event(published(body_of(reboot())))

    # THEN the error is logged once, cut to a few KiB with a marker
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(line) <= 2400
    assert line.endswith("more characters cut]")


def test_the_outcome_of_a_thousand_vm_event_is_logged_in_a_line_of_a_few_kib(
    world: World, mbridge_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN structured logging, and an outcome of 1,001 actions (a slot freed in a pool whose store
    # had refused many waiting VMs admits them all at once)
    logs.configure("INFO")
    vms = tuple(f"vmss-web_{n}" for n in range(1000))
    event = azure_event(kind=EventKind.REBOOT, event_id="E-MANY", reporter=vms[0], resources=vms, duration_seconds=-1)
    outcome = Outcome("e" * 64, Result.PROCESSED)
    outcome.actions.extend(Taken(ActionName.DRAIN, vm, None, "platform reboot", event) for vm in (*vms, "one-more"))

    # WHEN it is logged
    entry_module.log_outcome(outcome, {})

    # THEN its one line lists the first actions and counts the others
    (line,) = capsys.readouterr().out.splitlines()
    entry = json.loads(line)
    assert len(line) < 8 * 1024
    assert len(entry["actions"]) == 20
    assert entry["actions_not_listed"] == 981
    assert "more characters cut" in entry["message"]


def test_a_log_line_of_any_size_is_cut_to_a_few_kib(
    mbridge_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN structured logging
    logs.configure("INFO")
    # WHEN a record of 100,000 characters is logged, with the traceback of an error as long
    try:
        raise ValueError("v" * 100_000)
    except ValueError:
        logging.getLogger("mbridge.gcp.test").error("m" * 100_000, exc_info=True)
    # THEN its line keeps the start of both, and says how much was cut
    (line,) = capsys.readouterr().out.splitlines()
    message = json.loads(line)["message"]
    assert message.startswith("m" * 1000)
    assert "ValueError: vvvv" in message
    assert message.count("more characters cut") == 2
    assert len(line) < 24 * 1024


def test_a_malformed_envelope_is_audited_and_acknowledged(world: World) -> None:
    assert on_maintenance_event(published(b'{"specversion": "1.0", "id": "x"}')) is None
    (malformed,) = [record for record in world.store.query() if record.kind == "malformed"]
    assert "source" in malformed.reason
    assert world.balancer.drained == []


def test_a_message_without_data_is_audited_as_malformed(world: World) -> None:
    on_maintenance_event(published(None))
    assert world.kinds() == ["malformed"]


def test_data_that_is_not_base64_is_logged_and_acknowledged(world: World, caplog: pytest.LogCaptureFixture) -> None:
    assert on_maintenance_event(published("this is not base64 ***")) is None
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("acknowledged without processing" in m and "not base64" in m for m in errors)
    assert world.kinds() == []  # nothing to key an audit record on


def test_an_event_of_another_type_is_logged_and_acknowledged(world: World, caplog: pytest.LogCaptureFixture) -> None:
    event = published(body_of(reboot()))
    event["type"] = "google.cloud.storage.object.v1.finalized"
    on_maintenance_event(event)
    assert any("the trigger must be the Pub/Sub events topic" in r.getMessage() for r in caplog.records)
    assert world.balancer.drained == []


def test_an_agents_command_result_is_audited(world: World) -> None:
    result = CommandResult(command_id="c-1", accepted=False, event_id="E-REBOOT", target="web-0", reason="expired")
    on_maintenance_event(published(encode(envelope_for_command_result(result, Cloud.AZURE, NOW))))
    (audited,) = world.store.query()
    assert (audited.kind, audited.action, audited.reason) == ("command-result", "rejected", "expired")


def test_handle_message_returns_what_was_done(world: World) -> None:
    outcome = handle_message(body_of(reboot()), world.deps, NOW)
    assert [(taken.action, taken.vm) for taken in outcome.actions] == [
        ("drain", "web-0"),
        ("approve", "web-0"),
    ]


def test_message_body_is_the_decoded_pubsub_data() -> None:
    assert message_body(published(b"\x00raw bytes\xff")) == b"\x00raw bytes\xff"


# ---------------------------------------------------------------- when the bus took the message


@dataclass
class RecordingVerifier:
    """Takes every sender at its word, and records the time each proof was checked as of."""

    accepted: list[datetime] = field(default_factory=list)

    def verify(self, envelope: Envelope, accepted_at: datetime, now: datetime) -> Identity:
        self.accepted.append(accepted_at)
        return Identity(vm=envelope.source.rsplit("/", 1)[-1], how="attested")


def test_the_senders_proof_is_checked_as_of_the_messages_publish_time(world: World) -> None:
    # GIVEN a message Pub/Sub took at 12:00:00.481 (its publishTime)
    verifier = RecordingVerifier()

    # WHEN it is delivered
    with wiring.override(replace(world.deps, verifier=verifier)):
        on_maintenance_event(published(body_of(reboot())))

    # THEN the proof was checked as of then, and the report acted on
    assert verifier.accepted == [datetime(2026, 3, 1, 12, 0, 0, 481000, tzinfo=timezone.utc)]
    assert world.balancer.drained == ["web-0"]


@pytest.mark.parametrize("publish_time", [None, "yesterday", 1772366400], ids=["absent", "not-rfc3339", "a-number"])
def test_without_a_readable_publish_time_the_proof_is_checked_as_of_now(world: World, publish_time: object) -> None:
    verifier = RecordingVerifier()
    event = published(body_of(reboot()), publish_time=publish_time)
    before = datetime.now(timezone.utc)

    with wiring.override(replace(world.deps, verifier=verifier)):
        on_maintenance_event(event)

    (accepted,) = verifier.accepted
    assert before <= accepted <= datetime.now(timezone.utc)


# ---------------------------------------------------------------- over HTTP, through the functions framework


@pytest.fixture(scope="module")
def app() -> Any:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    application = functions_framework.create_app(  # type: ignore[no-untyped-call]  # the framework leaves it unannotated
        target="on_maintenance_event", source=str(ROOT / "main.py"), signature_type="cloudevent"
    )
    yield application
    root.handlers[:], root.level = handlers, level


Encoder = Callable[[CloudEvent], tuple[dict[str, str], bytes]]
ENCODINGS = [pytest.param(to_structured, id="structured"), pytest.param(to_binary, id="binary")]


def post(app: Any, encoder: Encoder, event: CloudEvent) -> Any:
    headers, body = encoder(event)
    return app.test_client().post("/", headers=headers, data=body)


@pytest.mark.parametrize("encoder", ENCODINGS)
def test_over_http_processed_and_duplicate_events_are_acknowledged(world: World, app: Any, encoder: Encoder) -> None:
    first = post(app, encoder, published(body_of(reboot()), message_id="1"))
    second = post(app, encoder, published(body_of(reboot()), message_id="2"))
    assert (first.status_code, second.status_code) == (200, 200)
    assert world.balancer.drained == ["web-0"]
    assert len(world.sender.commands) == 1


@pytest.mark.parametrize("encoder", ENCODINGS)
def test_over_http_a_transient_failure_answers_500(world: World, app: Any, encoder: Encoder) -> None:
    world.balancer.fail("remove", RetryableError("Firestore is unavailable"), times=None)
    response = post(app, encoder, published(body_of(reboot())))
    assert response.status_code == 500


@pytest.mark.parametrize("encoder", ENCODINGS)
def test_over_http_a_malformed_envelope_is_acknowledged_and_audited(world: World, app: Any, encoder: Encoder) -> None:
    response = post(app, encoder, published(b"not a cloudevent"))
    assert response.status_code == 200
    assert world.kinds() == ["malformed"]


# ---------------------------------------------------------------- settings


def test_settings_read_every_variable() -> None:
    certs_url = "https://certs.example.com/oauth2/v1/certs"
    settings = Settings.from_env(
        {
            "MBRIDGE_GCP_PROJECT": PROJECT,
            "MBRIDGE_FIRESTORE_DATABASE": "mbridge",
            "MBRIDGE_FIRESTORE_COLLECTION_PREFIX": "prod_",
            "MBRIDGE_PUBSUB_COMMANDS_TOPIC": "projects/hub/topics/commands",
            "MBRIDGE_INSTANCE_GROUPS": "europe-west1-b/web-b, europe-west1-c/web-c",
            "MBRIDGE_READINESS_DRAIN": "false",
            "MBRIDGE_POLICY": '{"drain_period_seconds": 45}',
            "MBRIDGE_SIGNING_KEY": "/secrets/signing.pem",
            "MBRIDGE_COMPUTE_TIMEOUT_SECONDS": "300",
            "MBRIDGE_LOG_LEVEL": "debug",
            "MBRIDGE_TRUST_AUDIENCE": "https://mbridge.example.com",
            "MBRIDGE_TRUST_PROJECTS": "shop-prod, shop-batch ,shop-prod,example.com:legacy-shop",
            "MBRIDGE_TRUST_ZONES": "europe-west1-b, europe-west1-c",
            "MBRIDGE_TRUST_CERTS_URL": certs_url,
            "MBRIDGE_COMMANDS_SHARDS": "8",
        }
    )
    assert settings == Settings(
        project=PROJECT,
        firestore_database="mbridge",
        firestore_prefix="prod_",
        commands_topic="projects/hub/topics/commands",
        instance_groups=(GroupRef("europe-west1-b", "web-b"), GroupRef("europe-west1-c", "web-c")),
        maintenance_zones=("europe-west1-b", "europe-west1-c"),  # the groups' zones unless set
        readiness_drain=False,
        policy=Policy(drain_period_seconds=45),
        signing_key="/secrets/signing.pem",
        compute_timeout=300.0,
        log_level="DEBUG",
        trust_audience="https://mbridge.example.com",
        trust_projects=("shop-prod", "shop-batch", "example.com:legacy-shop"),
        trust_zones=("europe-west1-b", "europe-west1-c"),
        trust_certs_url=certs_url,
        commands_shards=8,
    )


def test_settings_defaults_need_only_a_project() -> None:
    settings = Settings.from_env({"GOOGLE_CLOUD_PROJECT": PROJECT})
    assert settings == Settings(project=PROJECT)
    # identity tokens asked for the agents' default audience, by VMs of the function's own project,
    # checked with Google's certificates
    assert (settings.trust_file, settings.trust_audience) == (None, DEFAULT_AUDIENCE)
    assert settings.trusted_projects == (PROJECT,)
    assert settings.trusted_zones is None  # every zone of the trusted projects
    assert settings.trust_certs_url == "https://www.googleapis.com/oauth2/v1/certs"


def test_settings_take_a_trust_file_that_loads(tmp_path: Path) -> None:
    path = tmp_path / "trust.json"
    path.write_text(json.dumps({"format": TRUST_FILE_FORMAT}), encoding="utf-8")
    settings = Settings.from_env({"MBRIDGE_GCP_PROJECT": PROJECT, "MBRIDGE_TRUST_FILE": str(path)})
    assert settings.trust_file == str(path)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({}, "MBRIDGE_GCP_PROJECT is not set"),
        ({"MBRIDGE_INSTANCE_GROUPS": "web-b"}, r"MBRIDGE_INSTANCE_GROUPS: 'web-b' is not zone/name"),
        ({"MBRIDGE_MAINTENANCE_ZONES": "Europe West"}, "MBRIDGE_MAINTENANCE_ZONES"),
        ({"MBRIDGE_READINESS_DRAIN": "maybe"}, "MBRIDGE_READINESS_DRAIN='maybe': use true or false"),
        ({"MBRIDGE_READINESS_DRAIN": "off"}, "nothing can drain a VM"),
        ({"MBRIDGE_POLICY": '{"drain_period": 1}'}, "MBRIDGE_POLICY: unknown policy setting 'drain_period'"),
        ({"MBRIDGE_COMPUTE_TIMEOUT_SECONDS": "soon"}, "MBRIDGE_COMPUTE_TIMEOUT_SECONDS='soon'"),
        ({"MBRIDGE_LOG_LEVEL": "loud"}, "MBRIDGE_LOG_LEVEL='LOUD'"),
        ({"MBRIDGE_FIRESTORE_COLLECTION_PREFIX": "a/b"}, "MBRIDGE_FIRESTORE_COLLECTION_PREFIX"),
        ({"MBRIDGE_TRUST_FILE": "/nonexistent/trust.json"}, "MBRIDGE_TRUST_FILE: cannot read the trust file"),
        ({"MBRIDGE_TRUST_AUDIENCE": "maintenance bridge"}, "MBRIDGE_TRUST_AUDIENCE='maintenance bridge'"),
        ({"MBRIDGE_TRUST_AUDIENCE": "a" * 513}, "MBRIDGE_TRUST_AUDIENCE='aaa"),
        ({"MBRIDGE_TRUST_PROJECTS": "shop-prod,Shop Batch"}, "MBRIDGE_TRUST_PROJECTS: 'Shop Batch' is not a project"),
        ({"MBRIDGE_TRUST_PROJECTS": "123456789012"}, "MBRIDGE_TRUST_PROJECTS: '123456789012' is not a project id"),
        ({"MBRIDGE_TRUST_ZONES": "europe-west1-b,Europe West"}, "MBRIDGE_TRUST_ZONES: 'Europe West' is not a zone"),
        ({"MBRIDGE_TRUST_CERTS_URL": "http://www.googleapis.com/oauth2/v1/certs"}, "MBRIDGE_TRUST_CERTS_URL='http:"),
        ({"MBRIDGE_TRUST_CERTS_URL": "www.googleapis.com/oauth2/v1/certs"}, "MBRIDGE_TRUST_CERTS_URL='www"),
        ({"MBRIDGE_TRUST_CERTS_URL": "https://localhost:port/certs"}, "MBRIDGE_TRUST_CERTS_URL='https://localhost:"),
        ({"MBRIDGE_COMMANDS_SHARDS": "0"}, r"MBRIDGE_COMMANDS_SHARDS: .*from 1 to 1024"),
        ({"MBRIDGE_COMMANDS_SHARDS": "1025"}, r"MBRIDGE_COMMANDS_SHARDS: .*from 1 to 1024"),
        ({"MBRIDGE_COMMANDS_SHARDS": "eight"}, r"MBRIDGE_COMMANDS_SHARDS: .*from 1 to 1024"),
    ],
)
def test_settings_errors_name_the_variable(environ: dict[str, str], message: str) -> None:
    base = {"MBRIDGE_GCP_PROJECT": PROJECT} if "MBRIDGE_GCP_PROJECT" not in message else {}
    with pytest.raises(SettingsError, match=message):
        Settings.from_env({**base, **environ})


# ---------------------------------------------------------------- commands on Pub/Sub


@dataclass
class FakePublisher:
    """The network edge of the agent's Pub/Sub operator (its PublisherLike port)."""

    published: list[tuple[str, bytes, str, dict[str, str]]] = field(default_factory=list)

    def publish(self, topic: str, data: bytes, ordering_key: str = "", **kwargs: Any) -> Any:
        attributes = {key: value for key, value in kwargs.items() if key not in ("retry", "timeout")}
        self.published.append((topic, data, ordering_key, attributes))
        return self

    def result(self, timeout: float | None = None) -> str:
        return "message-id"

    def resume_publish(self, topic: str, ordering_key: str) -> None: ...

    def stop(self) -> None: ...


def anonymous() -> Credentials:
    return AnonymousCredentials()  # type: ignore[no-untyped-call]  # google-auth leaves it unannotated


def settings_for(**overrides: Any) -> Settings:
    return Settings(**{"project": PROJECT, **overrides})


def offline_clients(publisher: FakePublisher) -> wiring.Clients:
    """Real clients that make no call until used; compute points at a closed local port."""
    options: Mapping[str, Any] = {"credentials": anonymous(), "transport": "rest"}
    endpoint = {"api_endpoint": "http://127.0.0.1:9"}
    return wiring.Clients(
        firestore=lambda s: firestore.Client(project=s.project, credentials=anonymous()),
        instance_groups=lambda: compute_v1.InstanceGroupsClient(**options, client_options=endpoint),
        zone_operations=lambda: compute_v1.ZoneOperationsClient(**options, client_options=endpoint),
        instances=lambda: compute_v1.InstancesClient(**options, client_options=endpoint),
        publisher=lambda: publisher,  # type: ignore[arg-type,return-value]  # a fake of the library's publisher
    )


def test_commands_are_published_with_their_target_as_attribute_and_ordering_key() -> None:
    # GIVEN the wired sender over a publisher that records what reaches the library
    publisher = FakePublisher()
    deps = wiring.build_deps(settings_for(commands_topic="maintenance-commands"), offline_clients(publisher))
    command = Command(
        command_id="c" * 32,
        type=CommandType.APPROVE,
        target="web-0",
        event_id="E-REBOOT",
        issued_at=NOW,
        expires_at=NOW + timedelta(minutes=10),
    )
    # WHEN it sends a command
    deps.sender.send(command)
    # THEN the commands topic got the canonical command, keyed and addressed to web-0
    ((topic, data, key, attributes),) = publisher.published
    assert (topic, key) == (f"projects/{PROJECT}/topics/maintenance-commands", "web-0")
    assert decode_command(data).command == command
    assert attributes == {"type": "approve", "target": "web-0", "event_id": "E-REBOOT", "envelope_id": "c" * 32}
    assert isinstance(deps.sender, PubSubCommandSender)


def test_with_shards_each_command_is_published_on_the_topic_of_its_vms_shard() -> None:
    # GIVEN the wired sender of an app spreading commands over 8 topics
    publisher = FakePublisher()
    deps = wiring.build_deps(settings_for(commands_shards=8), offline_clients(publisher))
    vms = [f"vm-{i}" for i in range(8)]  # shards 7, 3, 7, 4, 4, 3, 1, 0 (tests/unit/test_shards.py)
    # WHEN it sends an approval to each VM
    for vm in vms:
        deps.sender.send(
            Command(
                command_id=vm.replace("-", "") * 4,
                type=CommandType.APPROVE,
                target=vm,
                event_id="E-REBOOT",
                issued_at=NOW,
                expires_at=NOW + timedelta(minutes=10),
            )
        )
    # THEN each was published on its VM's shard topic, keyed and addressed to that VM
    assert [(topic, key, attributes["target"]) for topic, _, key, attributes in publisher.published] == [
        (f"projects/{PROJECT}/topics/{entity_for('maintenance-commands', vm, 8)}", vm, vm) for vm in vms
    ]


# ---------------------------------------------------------------- wiring


def test_readiness_drains_are_signed_commands_when_a_key_is_configured() -> None:
    # GIVEN the app wired with a signing key and the readiness balancer only (no autohealer or probe to read)
    private_pem, public_pem = generate_keypair()
    publisher = FakePublisher()
    settings = settings_for(signing_key=private_pem.decode(), autohealer_check=False, read_probes=False)
    deps = wiring.build_deps(settings, offline_clients(publisher))
    # WHEN a VM is drained
    memento = deps.balancer.locate("web-0")
    assert memento is not None
    assert not publisher.published
    deps.balancer.remove("web-0", memento)
    # THEN the agent got a drain command signed with that key, and the memento says how to undo it
    assert memento["readiness"]["readiness"] is True
    command = decode_command(publisher.published[0][1]).command
    assert (command.type, command.target) == (CommandType.DRAIN, "web-0")
    assert command.signature is not None
    verify(command.signing_bytes(), command.signature, load_public_key(public_pem))
    assert deps.signer is not None
    assert (deps.maintenance, type(deps.store), type(deps.audit)) == (None, FirestoreStateStore, FirestoreAuditLog)


def test_instance_groups_and_maintenance_are_wired_when_configured() -> None:
    # GIVEN groups and zones configured, and the Compute API unreachable
    deps = wiring.build_deps(
        settings_for(instance_groups=(GroupRef("europe-west1-b", "web-b"),), maintenance_zones=("europe-west1-b",)),
        offline_clients(FakePublisher()),
    )
    memento = {"instance_groups": {"instance_groups": [{"zone": "europe-west1-b", "name": "web-b", "instance": "u"}]}}
    # WHEN an instance-group drain is restored THEN it went to the Compute API (and failed for now)
    with pytest.raises(ComputeUnavailableError):
        deps.balancer.restore("web-0", memento)
    assert isinstance(deps.maintenance, ComputeMaintenance)


def test_the_wired_verifier_follows_the_policys_trust() -> None:
    # GIVEN the default trust (attested) and trust reporter-name
    attested = wiring.build_deps(settings_for(), offline_clients(FakePublisher()))
    reporter_name = wiring.build_deps(
        settings_for(policy=Policy(trust="reporter-name")), offline_clients(FakePublisher())
    )
    # THEN the first verifies identity tokens, the second takes the reporter at its word
    assert isinstance(attested.verifier, CloudVerifier)
    assert reporter_name.verifier is None


@pytest.fixture
def mbridge_logger() -> Iterator[logging.Logger]:
    """The `mbridge` logger, put back as it was after the test configured it."""
    logger = logging.getLogger(logs.ROOT_LOGGER)
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield logger
    logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate


def test_deps_are_built_once_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, mbridge_logger: logging.Logger
) -> None:
    # GIVEN the environment of a deployment (Firestore through an emulator address: no credentials)
    monkeypatch.setenv("MBRIDGE_GCP_PROJECT", PROJECT)
    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", "127.0.0.1:9")
    wiring.reset()
    try:
        # WHEN two invocations ask for their deps THEN both get the same, built from the variables
        first, second = wiring.deps(), wiring.deps()
        assert first is second
        assert isinstance(first.store, FirestoreStateStore)
        assert mbridge_logger.level == logging.INFO
    finally:
        wiring.reset()


@pytest.mark.parametrize(
    ("audience", "warned"), [(None, True), ("maintenance-bridge/shop-prod/maintenance-bridge", False)]
)
def test_the_shared_default_audience_is_warned_of_at_start(
    monkeypatch: pytest.MonkeyPatch, mbridge_logger: logging.Logger, audience: str | None, warned: bool
) -> None:
    # GIVEN a deployment with the default audience, or one of its own
    monkeypatch.setenv("MBRIDGE_GCP_PROJECT", PROJECT)
    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", "127.0.0.1:9")
    if audience is not None:
        monkeypatch.setenv("MBRIDGE_TRUST_AUDIENCE", audience)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logger = logging.getLogger("mbridge.gcp.wiring")
    logger.addHandler(handler)
    wiring.reset()
    try:
        # WHEN it starts
        wiring.deps()
    finally:
        wiring.reset()
        logger.removeHandler(handler)
    # THEN only the shared one is warned of, naming the setting to change
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert bool(warnings) is warned
    if warned:
        (warning,) = warnings
        assert "MBRIDGE_TRUST_AUDIENCE is the shared default 'maintenance-bridge'" in warning
        assert f"maintenance-bridge/{PROJECT}/" in warning


def test_override_replaces_the_deps_inside_the_block_only(world: World) -> None:
    other = Deps(
        world.store, world.balancer, world.sender, world.store, Policy(dry_run=True), monotonic=FakeClock().monotonic
    )
    with wiring.override(other):
        assert wiring.deps() is other
    assert wiring.deps() is world.deps


# ---------------------------------------------------------------- structured logs


def test_a_log_line_is_one_json_object_cloud_logging_understands(
    mbridge_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN structured logging configured
    logs.configure("INFO")
    logs.configure("INFO")  # idempotent: still one handler
    # WHEN a record with labels and an exception is logged
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("mbridge.gcp.test").error(
            "processed %s", "abc", exc_info=True, extra={"labels": {"event_id": "E-1", "n": 3}, "payload": {"x": 1}}
        )
    # THEN stdout holds exactly one JSON line with severity, message (with the traceback), labels
    (line,) = capsys.readouterr().out.splitlines()
    entry = json.loads(line)
    assert entry["severity"] == "ERROR"
    assert entry["message"].startswith("processed abc\nTraceback")
    assert "ValueError: boom" in entry["message"]
    assert entry["logging.googleapis.com/labels"] == {"logger": "mbridge.gcp.test", "event_id": "E-1", "n": "3"}
    assert entry["logging.googleapis.com/sourceLocation"]["function"] == (
        "test_a_log_line_is_one_json_object_cloud_logging_understands"
    )
    assert (entry["x"], entry["time"].endswith("Z")) == (1, True)
    assert mbridge_logger.propagate is False


def test_a_line_of_a_trace_names_it_as_cloud_logging_links_it_to_cloud_trace(
    mbridge_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN structured logging of the function's project
    logs.configure("INFO", project="my-project-123")
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    log = logging.getLogger("mbridge.gcp.test")
    # WHEN a line of a maintenance's trace is logged, an outcome line, a line of no trace, and one
    # whose trace id is not one
    log.info("drained", extra=fields(event_id="E-1", vm="web-0", trace_id=trace_id))
    entry_module.log_outcome(Outcome("e" * 64, Result.PROCESSED, trace_id=trace_id), {})
    log.info("wired", extra=fields(trace_id=""))
    log.info("odd", extra={"trace_id": "not-a-trace"})
    drained, outcome, wired, odd = (json.loads(line) for line in capsys.readouterr().out.splitlines())

    # THEN the lines of the trace name it as projects/<project>/traces/<trace id>, beside the field,
    # and no span; the others name no trace
    linked = f"projects/my-project-123/traces/{trace_id}"
    assert (drained[logs.TRACE_KEY], drained["trace_id"]) == (linked, trace_id)
    assert outcome[logs.TRACE_KEY] == linked
    assert not any(key.endswith("/spanId") for key in drained)
    assert logs.TRACE_KEY not in wired
    assert logs.TRACE_KEY not in odd
    # ... and without a project (configured again: the same handler), no line names a trace
    logs.configure("INFO")
    log.info("drained", extra=fields(trace_id=trace_id))
    (line,) = capsys.readouterr().out.splitlines()
    assert logs.TRACE_KEY not in json.loads(line)


def test_info_records_log_at_info_severity(mbridge_logger: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("INFO")
    logging.getLogger("mbridge.gcp.test").debug("hidden")
    logging.getLogger("mbridge.gcp.test").info("shown")
    assert [json.loads(line)["severity"] for line in capsys.readouterr().out.splitlines()] == ["INFO"]
