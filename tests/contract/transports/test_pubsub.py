"""The Pub/Sub transport against Google's real Pub/Sub emulator (tests/peers.py starts it).

Each test works in a project of its own, so tests share one emulator without seeing each other's
messages. The IAM branch of check() cannot run on the emulator (testIamPermissions is UNIMPLEMENTED
there); the last tests cover it at the library boundary with small fakes.
"""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1  # type: ignore[import-untyped]  # the library ships no py.typed
import pytest
from google.api_core import exceptions as api_errors
from google.cloud.pubsub_v1.publisher import exceptions as publisher_errors  # type: ignore[import-untyped]

from tests.peers import start_pubsub_emulator
from wire.transports.base import InboundCommand, OutboundMessage, TransportConfigError, TransportUnavailableError
from wire.transports.pubsub import EVENTS_SUBSCRIPTION_ORDERED, PubSubOperator, PubSubSettings, PubSubTransport

VM = "vm-a"
OTHER_VM = "vm-b"
ACK_DEADLINE = 10  # the minimum Pub/Sub accepts
EVENTS_READER = "events-reader"


@dataclass
class Bus:
    """One project on the emulator with the topics and subscriptions infra/ would create."""

    project: str
    admin_publisher: Any
    admin_subscriber: Any

    @property
    def settings(self) -> PubSubSettings:
        return PubSubSettings(project=self.project, vm_name=VM, operation_timeout=10.0)

    def topic(self, name: str) -> str:
        return f"projects/{self.project}/topics/{name}"

    def subscription(self, name: str) -> str:
        return f"projects/{self.project}/subscriptions/{name}"

    def create(self, topic: str, *subscriptions: dict[str, Any]) -> None:
        self.admin_publisher.create_topic(name=self.topic(topic))
        for options in subscriptions:
            request = {"topic": self.topic(topic), "ack_deadline_seconds": ACK_DEADLINE, **options}
            request["name"] = self.subscription(options["name"])
            self.admin_subscriber.create_subscription(request=request)

    def pull(self, subscription: str, max_wait: float = 3.0) -> list[Any]:
        response = self.admin_subscriber.pull(
            subscription=self.subscription(subscription), max_messages=50, timeout=max_wait, retry=None
        )
        return list(response.received_messages)


def make_bus(project: str) -> Bus:
    bus = Bus(project, pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient())
    bus.create(
        "maintenance-events",
        # As the functions' subscription is deployed: no message ordering (docs/transports.md).
        {"name": EVENTS_READER, "enable_message_ordering": EVENTS_SUBSCRIPTION_ORDERED},
        {"name": "operator-results"},
    )
    bus.create(
        "maintenance-commands",
        # As deployed: one subscription per VM, filtered on target (the emulator ignores the filter).
        {
            "name": f"maintenance-commands-{VM}",
            "filter": f'attributes.target = "{VM}"',
            "enable_message_ordering": True,
        },
    )
    return bus


@pytest.fixture
def bus(pubsub_emulator: str) -> Iterator[Bus]:
    created = make_bus(f"mbridge-{uuid.uuid4().hex[:12]}")
    yield created
    created.admin_subscriber.close()


@pytest.fixture
def transport(bus: Bus) -> Iterator[PubSubTransport]:
    agent_transport = PubSubTransport(bus.settings)
    yield agent_transport
    agent_transport.close()


@pytest.fixture
def operator(bus: Bus) -> Iterator[PubSubOperator]:
    sender = PubSubOperator(bus.settings)
    yield sender
    sender.close()


def event(number: int, key: str = VM) -> OutboundMessage:
    envelope_id = f"{number:064x}"
    return OutboundMessage(
        envelope_id=envelope_id,
        body=b'{"id": "%s", "n": %d}' % (envelope_id.encode(), number),
        key=key,
        attributes={
            "type": "org.maintenancebridge.maintenance.scheduled",
            "vm": key,
            "cloud": "gce",
            "event_id": f"event-{number}",
        },
    )


def command(command_id: str, target: str) -> OutboundMessage:
    return OutboundMessage(
        envelope_id=command_id,
        body=b'{"command_id": "%s", "target": "%s"}' % (command_id.encode(), target.encode()),
        key=target,
        attributes={"type": "approve"},
    )


def receive_until(transport: PubSubTransport, count: int, within: float = 20.0) -> list[InboundCommand]:
    receiver = transport.commands
    assert receiver is not None
    received: list[InboundCommand] = []
    deadline = time.monotonic() + within
    while len(received) < count and time.monotonic() < deadline:
        received.extend(receiver.receive_commands(max_wait=2.0))
    return received


def read_until(operator: PubSubOperator, count: int, within: float = 20.0) -> list[bytes]:
    results: list[bytes] = []
    deadline = time.monotonic() + within
    while len(results) < count and time.monotonic() < deadline:
        results.extend(operator.read_results(max_wait=2.0))
    return results


def pull_until(bus: Bus, subscription: str, count: int, within: float = 20.0) -> list[Any]:
    received: list[Any] = []
    deadline = time.monotonic() + within
    while len(received) < count and time.monotonic() < deadline:
        received.extend(bus.pull(subscription))
    return received


# ---------------------------------------------------------------- events


@pytest.mark.peer
def test_events_arrive_unkeyed_in_publish_order_with_data_and_attributes(bus: Bus, transport: PubSubTransport) -> None:
    # GIVEN five envelopes of one VM
    messages = [event(number) for number in range(5)]
    # WHEN the agent publishes them one after the other
    for message in messages:
        transport.publish(message)
    # THEN a consumer of the events topic receives each, data and attributes intact, published in
    # that order (each publish returns once Pub/Sub stored it), and none carries an ordering key
    # another agent could claim
    received = sorted(pull_until(bus, EVENTS_READER, len(messages)), key=lambda item: item.message.publish_time)
    assert [bytes(item.message.data) for item in received] == [message.body for message in messages]
    for item, message in zip(received, messages):
        assert dict(item.message.attributes) == {**message.attributes, "envelope_id": message.envelope_id}
        assert item.message.ordering_key == ""


@pytest.mark.peer
def test_publish_to_a_missing_topic_names_it_and_publishing_recovers(bus: Bus) -> None:
    # GIVEN a transport whose events topic does not exist yet
    settings = PubSubSettings(project=bus.project, topic="not-yet-there", vm_name=VM, operation_timeout=10.0)
    transport = PubSubTransport(settings)
    try:
        # WHEN it publishes
        with pytest.raises(TransportConfigError) as failure:
            transport.publish(event(1))
        # THEN the error names the topic and the flag
        assert bus.topic("not-yet-there") in str(failure.value)
        assert "--pubsub-topic" in str(failure.value)
        # AND once the topic exists, the same transport publishes again
        bus.create("not-yet-there", {"name": "late-reader"})
        transport.publish(event(2))
        assert [bytes(item.message.data) for item in pull_until(bus, "late-reader", 1)] == [event(2).body]
    finally:
        transport.close()


@pytest.mark.peer
def test_commands_keep_their_ordering_key_and_it_recovers_after_a_failed_publish(bus: Bus) -> None:
    # GIVEN an operator whose commands topic does not exist yet
    settings = PubSubSettings(project=bus.project, commands_topic="commands-not-yet", operation_timeout=10.0)
    operator = PubSubOperator(settings)
    try:
        # WHEN a command fails to publish, and the topic then exists
        with pytest.raises(TransportConfigError):
            operator.send_command(command("first", VM))
        bus.create("commands-not-yet", {"name": "late-commands", "enable_message_ordering": True})
        # THEN the next command for the same VM goes out (the library paused its key: it was resumed),
        # keyed with its target: commands stay in order per VM, and only the functions and operators
        # may publish them
        operator.send_command(command("second", VM))
        received = pull_until(bus, "late-commands", 1)
        assert [bytes(item.message.data) for item in received] == [command("second", VM).body]
        assert received[0].message.ordering_key == VM
    finally:
        operator.close()


# ---------------------------------------------------------------- commands


@pytest.mark.peer
@pytest.mark.slow
def test_commands_reach_their_target_and_settle_acknowledges(
    bus: Bus, transport: PubSubTransport, operator: PubSubOperator
) -> None:
    # GIVEN a command for another VM and two for this one, sent by the operator
    operator.send_command(command("for-other", OTHER_VM))
    operator.send_command(command("first", VM))
    operator.send_command(command("second", VM))
    # WHEN the agent receives
    received = receive_until(transport, 2)
    # THEN it gets exactly its own two, in order, with their attributes
    assert [item.body for item in received] == [command("first", VM).body, command("second", VM).body]
    assert [item.attributes["target"] for item in received] == [VM, VM]
    assert [item.attributes["envelope_id"] for item in received] == ["first", "second"]
    assert received[0].attributes["type"] == "approve"
    # WHEN only the first is settled and the ack deadline passes
    received[0].settle()
    time.sleep(ACK_DEADLINE + 2)
    # THEN only the unsettled one comes again: the settled one and the dropped foreign one were acked
    again = pull_until(bus, f"maintenance-commands-{VM}", 1, within=8.0)
    assert [bytes(item.message.data) for item in again] == [command("second", VM).body]
    assert bus.pull(f"maintenance-commands-{VM}", max_wait=2.0) == []


@pytest.mark.peer
def test_a_foreign_command_never_reaches_the_caller(bus: Bus, transport: PubSubTransport) -> None:
    # GIVEN only a command for another VM on this VM's subscription
    bus.admin_publisher.publish(bus.topic("maintenance-commands"), b"{}", target=OTHER_VM).result(timeout=10)
    # WHEN the agent receives
    received = receive_until(transport, 1, within=5.0)
    # THEN nothing is handed over
    assert received == []


@pytest.mark.peer
def test_an_empty_pull_returns_nothing_within_the_wait(transport: PubSubTransport) -> None:
    # GIVEN no commands
    receiver = transport.commands
    assert receiver is not None
    # WHEN the agent waits up to 3 s
    started = time.monotonic()
    received = receiver.receive_commands(max_wait=3.0)
    # THEN it gets nothing, and no later than the wait (plus scheduling slack)
    assert received == []
    assert time.monotonic() - started < 3.0 + 2.0


@pytest.mark.peer
@pytest.mark.slow
def test_results_are_read_from_the_events_channel_and_acknowledged(
    bus: Bus, transport: PubSubTransport, operator: PubSubOperator
) -> None:
    # GIVEN the agent published a command result on the events channel
    result = OutboundMessage(
        envelope_id="r" * 64,
        body=b'{"type": "org.maintenancebridge.command.accepted"}',
        key=VM,
        attributes={"type": "org.maintenancebridge.command.accepted", "vm": VM, "cloud": "gce", "event_id": "e"},
    )
    transport.publish(result)
    # WHEN the operator reads results
    results = read_until(operator, 1)
    # THEN it gets the envelope, and it is not delivered again after the ack deadline
    assert results == [result.body]
    time.sleep(ACK_DEADLINE + 2)
    assert operator.read_results(max_wait=2.0) == []


# ---------------------------------------------------------------- check()


@pytest.mark.peer
def test_check_passes_on_existing_resources_without_side_effects(bus: Bus, transport: PubSubTransport) -> None:
    # WHEN the agent checks its transport on the emulator
    description = transport.check()
    # THEN it names what it verified, and nothing was published
    assert bus.topic("maintenance-events") in description
    assert bus.subscription(f"maintenance-commands-{VM}") in description
    assert bus.pull(EVENTS_READER, max_wait=2.0) == []


@pytest.mark.peer
def test_check_names_a_missing_topic(bus: Bus) -> None:
    # GIVEN a topic name that does not exist
    transport = PubSubTransport(PubSubSettings(project=bus.project, topic="typo-events", vm_name=VM))
    try:
        # WHEN the agent checks
        with pytest.raises(TransportConfigError) as failure:
            transport.check()
        # THEN the error names the topic and the flag to fix
        assert bus.topic("typo-events") in str(failure.value)
        assert "--pubsub-topic" in str(failure.value)
    finally:
        transport.close()


@pytest.mark.peer
def test_check_names_a_missing_commands_subscription(bus: Bus) -> None:
    # GIVEN a VM whose per-VM subscription was never created
    transport = PubSubTransport(PubSubSettings(project=bus.project, vm_name="vm-unknown"))
    try:
        # WHEN the agent checks
        with pytest.raises(TransportConfigError) as failure:
            transport.check()
        # THEN the error names the default subscription and the flag
        assert bus.subscription("maintenance-commands-vm-unknown") in str(failure.value)
        assert "--pubsub-commands-subscription" in str(failure.value)
    finally:
        transport.close()


@pytest.mark.peer
def test_operator_check_passes_on_existing_resources(operator: PubSubOperator, bus: Bus) -> None:
    # WHEN the operator side checks
    description = operator.check()
    # THEN it names the commands topic and the results subscription
    assert bus.topic("maintenance-commands") in description
    assert bus.subscription("operator-results") in description


# ---------------------------------------------------------------- an emulator that goes away


@pytest.mark.peer
def test_a_stopped_emulator_makes_the_transport_unavailable(
    pubsub_emulator: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a private emulator the transport has already published to
    peer = start_pubsub_emulator(tmp_path)
    try:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", peer.host)
        bus = make_bus("mbridge-private")
        transport = PubSubTransport(bus.settings)
        transport.publish(event(1))
        receiver = transport.commands
        assert receiver is not None
        # WHEN the emulator stops
        peer.stop()
        # THEN publishing, receiving and checking are retryable failures, each well within its timeout
        started = time.monotonic()
        with pytest.raises(TransportUnavailableError):
            transport.publish(event(2))
        with pytest.raises(TransportUnavailableError):
            receiver.receive_commands(max_wait=2.0)
        with pytest.raises(TransportUnavailableError):
            transport.check()
        assert time.monotonic() - started < 3 * bus.settings.operation_timeout
        transport.close()
    finally:
        peer.stop()


# ---------------------------------------------------------------- settings


def test_settings_need_a_project() -> None:
    # WHEN the project is empty THEN the error names the flag
    with pytest.raises(TransportConfigError, match="--pubsub-project"):
        PubSubSettings(project=" ", vm_name=VM).validate()


def test_the_commands_subscription_defaults_to_one_per_vm() -> None:
    # GIVEN no explicit subscription THEN it is maintenance-commands-<vm>; an explicit one wins
    assert PubSubSettings(project="p", vm_name="web-7").commands_subscription_name == "maintenance-commands-web-7"
    explicit = PubSubSettings(project="p", vm_name="web-7", commands_subscription="mine")
    assert explicit.commands_subscription_name == "mine"
    assert explicit.subscription_path("projects/q/subscriptions/x") == "projects/q/subscriptions/x"


def test_the_agent_transport_needs_the_vm_name() -> None:
    # WHEN the VM name is unknown THEN the transport refuses to start (no commands could reach it)
    with pytest.raises(TransportConfigError, match="VM's name"):
        PubSubTransport(PubSubSettings(project="p"), publisher_factory=FakePublisher, subscriber_factory=FakeSubscriber)


# ---------------------------------------------------------------- check() on real Pub/Sub: IAM, at the library boundary


@dataclass
class Permissions:
    permissions: Sequence[str]


class FakePublisher:
    """The publisher calls check() makes on real Pub/Sub; records the IAM requests."""

    def __init__(self, granted: Sequence[str] = ("pubsub.topics.publish",), error: Exception | None = None) -> None:
        self.granted = granted
        self.error = error
        self.requests: list[Mapping[str, Any]] = []

    def publish(
        self, topic: str, data: bytes, ordering_key: str = "", retry: Any = None, timeout: Any = None, **attrs: str
    ) -> Any:
        raise AssertionError("check() must not publish")

    def resume_publish(self, topic: str, ordering_key: str) -> None:
        raise AssertionError("not expected")

    def get_topic(self, *, topic: str, retry: Any = None, timeout: Any = None) -> object:
        raise AssertionError("real Pub/Sub is checked with testIamPermissions, not get_topic")

    def test_iam_permissions(self, *, request: Mapping[str, Any], retry: Any = None, timeout: Any = None) -> Any:
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        return Permissions([p for p in request["permissions"] if p in self.granted])

    def stop(self) -> None:
        pass


class FakeSubscriber:
    def __init__(self, granted: Sequence[str] = ("pubsub.subscriptions.consume",)) -> None:
        self.granted = granted
        self.requests: list[Mapping[str, Any]] = []

    def pull(self, *, subscription: str, max_messages: int, retry: Any = None, timeout: Any = None) -> Any:
        raise AssertionError("check() must not pull")

    def acknowledge(self, *, subscription: str, ack_ids: Sequence[str], retry: Any = None, timeout: Any = None) -> None:
        raise AssertionError("check() must not acknowledge")

    def get_subscription(self, *, subscription: str, retry: Any = None, timeout: Any = None) -> object:
        raise AssertionError("real Pub/Sub is checked with testIamPermissions, not get_subscription")

    def test_iam_permissions(self, *, request: Mapping[str, Any], retry: Any = None, timeout: Any = None) -> Any:
        self.requests.append(request)
        return Permissions([p for p in request["permissions"] if p in self.granted])

    def close(self) -> None:
        pass


def iam_transport(publisher: FakePublisher, subscriber: FakeSubscriber) -> PubSubTransport:
    return PubSubTransport(
        PubSubSettings(project="prod", vm_name=VM),
        publisher_factory=lambda: publisher,
        subscriber_factory=lambda: subscriber,
        emulator=False,
    )


def test_check_on_real_pubsub_asks_iam_for_exactly_the_permissions_used() -> None:
    # GIVEN credentials holding both permissions
    publisher, subscriber = FakePublisher(), FakeSubscriber()
    # WHEN the agent checks
    description = iam_transport(publisher, subscriber).check()
    # THEN it asked testIamPermissions on the topic and on its subscription, nothing else
    assert publisher.requests == [
        {"resource": "projects/prod/topics/maintenance-events", "permissions": ["pubsub.topics.publish"]}
    ]
    assert subscriber.requests == [
        {
            "resource": f"projects/prod/subscriptions/maintenance-commands-{VM}",
            "permissions": ["pubsub.subscriptions.consume"],
        }
    ]
    assert "allowed to publish" in description


def test_check_names_the_missing_role_when_a_permission_is_not_granted() -> None:
    # GIVEN credentials that may publish but not consume
    transport = iam_transport(FakePublisher(), FakeSubscriber(granted=()))
    # WHEN the agent checks THEN the error names the permission, the subscription and the role to grant
    with pytest.raises(TransportConfigError) as failure:
        transport.check()
    message = str(failure.value)
    assert "pubsub.subscriptions.consume" in message
    assert f"maintenance-commands-{VM}" in message
    assert "roles/pubsub.subscriber" in message


def api_error(kind: type[api_errors.GoogleAPICallError], message: str) -> Exception:
    # Through type[...]: mypy flags direct calls of api_core's unannotated exception constructors.
    return kind(message)


@pytest.mark.parametrize(
    ("error", "expected", "words"),
    [
        (api_error(api_errors.PermissionDenied, "denied"), TransportConfigError, "roles/pubsub.publisher"),
        (api_error(api_errors.NotFound, "no topic"), TransportConfigError, "--pubsub-topic"),
        (api_error(api_errors.Unauthenticated, "bad token"), TransportConfigError, "GOOGLE_APPLICATION_CREDENTIALS"),
        (api_error(api_errors.ServiceUnavailable, "down"), TransportUnavailableError, "will retry"),
        (api_error(api_errors.DeadlineExceeded, "slow"), TransportUnavailableError, "timed out"),
        (concurrent.futures.TimeoutError(), TransportUnavailableError, "timed out"),
        (publisher_errors.PublishToPausedOrderingKeyException(VM), TransportUnavailableError, "will retry"),
    ],
)
def test_library_errors_map_to_config_or_unavailable(error: Exception, expected: type[Exception], words: str) -> None:
    # GIVEN testIamPermissions failing with a library error
    transport = iam_transport(FakePublisher(error=error), FakeSubscriber())
    # WHEN the agent checks THEN the error is ours, says what to do, and keeps the cause
    with pytest.raises(expected) as failure:
        transport.check()
    assert words in str(failure.value)
    assert "projects/prod/topics/maintenance-events" in str(failure.value)
    assert failure.value.__cause__ is error
