"""The Service Bus transport at the SDK boundary (no broker can run here: docs/transports.md#trying-it-without-azure).

The fakes stand in for the network edge only: the client, its senders and receivers. Messages are
the SDK's own: the transport builds real `ServiceBusMessage`s, and what the fake receivers hand out
are real `ServiceBusReceivedMessage`s made by running the sent message through the SDK's AMQP
encoder and decoder — so they look exactly as received from a broker (application property keys
and string values as bytes, the body as byte sections).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from azure.core import exceptions as core_errors
from azure.core.credentials import AccessToken
from azure.identity import CredentialUnavailableError
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus import exceptions as sb_errors

# Private SDK modules, used only to build received messages the way the SDK decodes them off the wire.
from azure.servicebus._pyamqp._decode import decode_payload
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._pyamqp.message import Header
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport

from agent.commands import CommandLedger, CommandProcessor
from agent.config import ConfigError, settings_from_args
from mbridge.cli import build_parser
from tests.kit import FakeClock, RecordingReadiness
from tests.unit.test_command_processor import EVENT_ID, FakeImds
from wire.commands import CommandType, encode_command, new_command
from wire.model import Cloud
from wire.shards import entity_for
from wire.signing import generate_keypair
from wire.transports.base import OutboundMessage, TransportConfigError, TransportUnavailableError
from wire.transports.factory import servicebus_settings
from wire.transports.servicebus import (
    COMMAND_CONTENT_TYPE,
    EVENT_CONTENT_TYPE,
    ServiceBusClientLike,
    ServiceBusOperator,
    ServiceBusSettings,
    ServiceBusTransport,
    connect,
)

VM = "vm-a"
NAMESPACE = "mbridge-test.servicebus.windows.net"
# Syntactically valid; the key is base64 of "not-a-real-key".
CONNECTION_STRING = f"Endpoint=sb://{NAMESPACE}/;SharedAccessKeyName=agent;SharedAccessKey=bm90LWEtcmVhbC1rZXk="
T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
LOCK_DURATION = timedelta(seconds=60)
LOCKED_UNTIL = b"x-opt-locked-until"  # the broker's annotation of a message lock


# ---------------------------------------------------------------- fakes of the network edge


def received(
    message: ServiceBusMessage, delivery_count: int | None = None, locked_until: datetime | None = None
) -> ServiceBusReceivedMessage:
    """`message` as a receiver gets it from the broker: through the SDK's AMQP codec. `locked_until`:
    the message lock the broker annotates a message received outside a session with."""
    wire = bytearray()
    encode_payload(wire, PyamqpTransport.to_outgoing_amqp_message(message.raw_amqp_message))
    decoded = decode_payload(memoryview(bytes(wire)))
    if delivery_count is not None:
        decoded = decoded._replace(header=Header(delivery_count=delivery_count))
    if locked_until is not None:
        expiry = int(locked_until.timestamp() * 1000)
        decoded = decoded._replace(message_annotations={**(decoded.message_annotations or {}), LOCKED_UNTIL: expiry})
    return ServiceBusReceivedMessage(decoded, receiver=None)


class Faults:
    """Errors to raise from the next handler operations, by operation name."""

    def __init__(self) -> None:
        self.pending: dict[str, list[BaseException]] = {}

    def add(self, operation: str, error: BaseException) -> None:
        self.pending.setdefault(operation, []).append(error)

    def raise_if_any(self, operation: str) -> None:
        errors = self.pending.get(operation)
        if errors:
            raise errors.pop(0)


class FakeSession:
    def __init__(self, clock: FakeClock, faults: Faults) -> None:
        self.clock = clock
        self.faults = faults
        self.locked_until: datetime | None = clock.now() + LOCK_DURATION
        self.renewals = 0

    @property
    def locked_until_utc(self) -> datetime | None:
        return self.locked_until

    def renew_lock(self, *, timeout: float | None = None) -> datetime:
        self.faults.raise_if_any("renew")
        self.renewals += 1
        self.locked_until = self.clock.now() + LOCK_DURATION
        return self.locked_until


class FakeSender:
    def __init__(self, entity: str, faults: Faults) -> None:
        self.entity = entity
        self.faults = faults
        self.sent: list[ServiceBusMessage] = []
        self.timeouts: list[float | None] = []
        self.opened = False
        self.closed = False

    def send_messages(self, message: ServiceBusMessage, *, timeout: float | None = None) -> None:
        self.faults.raise_if_any("send")
        self.sent.append(message)
        self.timeouts.append(timeout)

    def create_message_batch(self) -> object:
        self.faults.raise_if_any("open_sender")
        self.opened = True
        return object()

    def close(self) -> None:
        self.closed = True


class FakeReceiver:
    def __init__(
        self,
        entity: str,
        session_id: str | None,
        inbox: list[ServiceBusReceivedMessage],
        clock: FakeClock,
        faults: Faults,
    ):
        self.entity = entity
        self.session_id = session_id
        self.inbox = inbox
        self.faults = faults
        self.fake_session = FakeSession(clock, faults)
        self.receive_calls: list[tuple[int | None, float | None]] = []
        self.completed: list[ServiceBusReceivedMessage] = []
        self.renewed_messages: list[str | None] = []
        self.opened = False
        self.closed = False

    @property
    def session(self) -> FakeSession:
        if self.session_id is None:
            raise AssertionError(f"{self.entity} is not a session receiver: it has no session lock")
        return self.fake_session

    def __enter__(self) -> FakeReceiver:
        self.faults.raise_if_any("open_receiver")
        self.opened = True
        return self

    def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[ServiceBusReceivedMessage]:
        self.faults.raise_if_any("receive")
        self.receive_calls.append((max_message_count, max_wait_time))
        count = max_message_count or 1
        handed, self.inbox[:] = self.inbox[:count], self.inbox[count:]
        return handed

    def complete_message(self, message: ServiceBusReceivedMessage) -> None:
        self.faults.raise_if_any("complete")
        self.completed.append(message)

    def renew_message_lock(self, message: ServiceBusReceivedMessage, *, timeout: float | None = None) -> datetime:
        self.faults.raise_if_any("renew_message")
        self.renewed_messages.append(message.message_id)
        return self.fake_session.clock.now() + LOCK_DURATION

    def close(self) -> None:
        self.closed = True


class FakeClient:
    """The ServiceBusClient surface the transport uses; records every handler it hands out."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock or FakeClock(T0)
        self.faults = Faults()
        self.inbox: list[ServiceBusReceivedMessage] = []
        self.senders: list[FakeSender] = []
        self.receivers: list[FakeReceiver] = []
        self.closed = False

    def get_topic_sender(self, topic_name: str) -> FakeSender:
        return self._sender(f"topic:{topic_name}")

    def get_queue_sender(self, queue_name: str) -> FakeSender:
        return self._sender(f"queue:{queue_name}")

    def get_queue_receiver(self, queue_name: str, *, session_id: str | None = None) -> FakeReceiver:
        return self._receiver(f"queue:{queue_name}", session_id)

    def get_subscription_receiver(self, topic_name: str, subscription_name: str) -> FakeReceiver:
        return self._receiver(f"subscription:{topic_name}/{subscription_name}", None)

    def close(self) -> None:
        self.closed = True

    def _sender(self, entity: str) -> FakeSender:
        sender = FakeSender(entity, self.faults)
        self.senders.append(sender)
        return sender

    def _receiver(self, entity: str, session_id: str | None) -> FakeReceiver:
        receiver = FakeReceiver(entity, session_id, self.inbox, self.clock, self.faults)
        self.receivers.append(receiver)
        return receiver


def settings(**overrides: Any) -> ServiceBusSettings:
    values: dict[str, Any] = {"namespace": NAMESPACE, "vm_name": VM, "operation_timeout": 7.0}
    values.update(overrides)
    return ServiceBusSettings(**values)


def agent(client: FakeClient, **overrides: Any) -> ServiceBusTransport:
    def factory(_: ServiceBusSettings) -> ServiceBusClientLike:
        return client

    return ServiceBusTransport(settings(**overrides), client_factory=factory, now=client.clock.now)


def operator(client: FakeClient, **overrides: Any) -> ServiceBusOperator:
    return ServiceBusOperator(settings(vm_name="", **overrides), client_factory=lambda _: client)


COMMANDS_TOPIC = "maintenance-commands"
SUBSCRIPTION = f"vm-{VM}"


def isolated_agent(client: FakeClient, **overrides: Any) -> ServiceBusTransport:
    """An agent in the isolated mode: its own subscription of the commands topic."""
    values: dict[str, Any] = {"commands_topic": COMMANDS_TOPIC, "commands_subscription": SUBSCRIPTION}
    values.update(overrides)
    return agent(client, **values)


def event(number: int = 1) -> OutboundMessage:
    return OutboundMessage(
        envelope_id=f"{number:064x}",
        body=b'{"specversion": "1.0", "n": %d}' % number,
        key=VM,
        attributes={
            "type": "org.maintenancebridge.maintenance.scheduled",
            "vm": VM,
            "cloud": "azure",
            "event_id": "E1",
        },
    )


def command(command_id: str = "cmd-1", target: str = VM) -> OutboundMessage:
    return OutboundMessage(
        envelope_id=command_id,
        body=b'{"command_id": "%s", "type": "approve"}' % command_id.encode(),
        key=target,
        attributes={"type": "approve"},
    )


def body_of(message: ServiceBusMessage | ServiceBusReceivedMessage) -> bytes:
    return b"".join(message.body)


def queued_command(client: FakeClient, command_id: str = "cmd-1", delivery_count: int | None = None) -> None:
    """Put a command on the fake broker exactly as `mbridge approve` would have sent it."""
    sending = FakeClient()
    operator(sending).send_command(command(command_id))
    client.inbox.append(received(sending.senders[0].sent[0], delivery_count))


def published_command(
    client: FakeClient, message: OutboundMessage | None = None, locked_until: datetime | None = None
) -> None:
    """Put a command on this VM's subscription exactly as the topic-mode sender sent it (the
    subscription's filter passed it: its `target` is this VM)."""
    sending = FakeClient()
    operator(sending, commands_topic=COMMANDS_TOPIC).send_command(message or command())
    client.inbox.append(received(sending.senders[0].sent[0], locked_until=locked_until))


# ---------------------------------------------------------------- publishing events


def test_publish_sends_the_envelope_as_a_service_bus_message() -> None:
    # GIVEN an agent transport on a fake client
    client = FakeClient()
    transport = agent(client)
    # WHEN an envelope is published
    transport.publish(event())
    # THEN one real ServiceBusMessage went to the events topic, shaped as docs/contracts.md#on-the-bus says
    [sender] = client.senders
    assert sender.entity == "topic:maintenance-events"
    [message] = sender.sent
    assert isinstance(message, ServiceBusMessage)
    assert message.message_id == event().envelope_id
    assert body_of(message) == event().body
    assert message.content_type == EVENT_CONTENT_TYPE
    assert message.subject == "org.maintenancebridge.maintenance.scheduled"
    assert message.application_properties == {**event().attributes, "envelope_id": event().envelope_id}
    assert message.session_id is None
    assert sender.timeouts == [7.0]


def test_one_sender_is_kept_open_and_reused() -> None:
    # GIVEN an agent transport
    client = FakeClient()
    transport = agent(client)
    # WHEN it publishes three envelopes
    for number in range(3):
        transport.publish(event(number))
    # THEN a single sender carried all three, in order
    assert len(client.senders) == 1
    assert [message.message_id for message in client.senders[0].sent] == [event(n).envelope_id for n in range(3)]


def test_the_sender_is_recreated_after_an_error() -> None:
    # GIVEN a sender whose link drops on the first send
    client = FakeClient()
    transport = agent(client)
    client.faults.add("send", sb_errors.ServiceBusConnectionError(message="link detached"))
    # WHEN publishing fails and the caller retries
    with pytest.raises(TransportUnavailableError):
        transport.publish(event())
    transport.publish(event())
    # THEN the failed sender was closed and a new one delivered the retry
    first, second = client.senders
    assert first.closed
    assert first.sent == []
    assert [message.message_id for message in second.sent] == [event().envelope_id]


@pytest.mark.parametrize(
    ("error", "expected", "words"),
    [
        (sb_errors.ServiceBusAuthenticationError(message="bad token"), TransportConfigError, "managed identity"),
        (core_errors.ClientAuthenticationError("no token"), TransportConfigError, "managed identity"),
        (CredentialUnavailableError("no identity endpoint"), TransportConfigError, "managed identity"),
        (sb_errors.ServiceBusAuthorizationError(message="no Send claim"), TransportConfigError, "Data Sender"),
        (sb_errors.MessagingEntityNotFoundError(message="no topic"), TransportConfigError, "--servicebus-topic"),
        (sb_errors.MessagingEntityDisabledError(message="disabled"), TransportConfigError, "disabled"),
        (sb_errors.MessageSizeExceededError(message="too big"), TransportConfigError, "larger"),
        (sb_errors.ServiceBusConnectionError(message="reset"), TransportUnavailableError, "will retry"),
        (sb_errors.ServiceBusCommunicationError(message="dns"), TransportUnavailableError, "will retry"),
        (sb_errors.OperationTimeoutError(message="slow"), TransportUnavailableError, "will retry"),
        (sb_errors.ServiceBusServerBusyError(message="busy"), TransportUnavailableError, "will retry"),
        (sb_errors.ServiceBusQuotaExceededError(message="full"), TransportUnavailableError, "full"),
        (core_errors.ServiceRequestError("unreachable"), TransportUnavailableError, "will retry"),
        (ConnectionResetError("reset by peer"), TransportUnavailableError, "will retry"),
        (TimeoutError("socket timeout"), TransportUnavailableError, "will retry"),
    ],
)
def test_sdk_errors_map_to_config_or_unavailable(error: Exception, expected: type[Exception], words: str) -> None:
    # GIVEN a send failing with an SDK (or socket) error
    client = FakeClient()
    transport = agent(client)
    client.faults.add("send", error)
    # WHEN publishing THEN the error is ours, names the topic, says what to do, and keeps the cause
    with pytest.raises(expected) as failure:
        transport.publish(event())
    assert words in str(failure.value)
    assert f"topic 'maintenance-events' in {NAMESPACE}" in str(failure.value)
    assert failure.value.__cause__ is error
    # AND the sender is discarded either way
    assert client.senders[0].closed


def test_a_programming_error_is_not_disguised_as_a_bus_error() -> None:
    # GIVEN a send failing with a bug, not a bus failure
    client = FakeClient()
    transport = agent(client)
    client.faults.add("send", TypeError("bad argument"))
    # WHEN publishing THEN it propagates unchanged
    with pytest.raises(TypeError, match="bad argument"):
        transport.publish(event())


# ---------------------------------------------------------------- receiving commands


def receiver_of(transport: ServiceBusTransport) -> Any:
    commands = transport.commands
    assert commands is not None
    return commands


def test_the_command_receiver_is_bound_to_this_vms_session() -> None:
    # GIVEN an agent transport for VM vm-a
    client = FakeClient()
    transport = agent(client)
    # WHEN it receives
    assert receiver_of(transport).receive_commands(max_wait=5.0) == []
    # THEN it received from the commands queue, session = its VM name, up to 10 messages within the wait
    [receiver] = client.receivers
    assert (receiver.entity, receiver.session_id) == ("queue:maintenance-commands", VM)
    assert receiver.receive_calls == [(10, 5.0)]


def test_a_received_command_carries_its_body_and_text_attributes() -> None:
    # GIVEN a command on the queue as the operator sent it, delivered for the second time
    client = FakeClient()
    queued_command(client, "cmd-7", delivery_count=2)
    # WHEN the agent receives
    [inbound] = receiver_of(agent(client)).receive_commands(max_wait=1.0)
    # THEN the body is the bytes sent and the attributes are text (the SDK hands them over as bytes)
    assert inbound.body == command("cmd-7").body
    assert inbound.attributes == {"type": "approve", "envelope_id": "cmd-7", "target": VM}
    assert inbound.delivery_count == 2


def test_settle_completes_the_message_once_and_not_before() -> None:
    # GIVEN a received command
    client = FakeClient()
    queued_command(client)
    [inbound] = receiver_of(agent(client)).receive_commands(max_wait=1.0)
    [receiver] = client.receivers
    # THEN nothing is completed before settle
    assert receiver.completed == []
    # WHEN it is settled twice
    inbound.settle()
    inbound.settle()
    # THEN it was completed once, through the receiver that received it
    assert [message.message_id for message in receiver.completed] == ["cmd-1"]


@pytest.mark.parametrize(
    "error",
    [sb_errors.SessionCannotBeLockedError(message="locked"), sb_errors.SessionLockLostError(message="lost")],
)
def test_session_errors_say_another_agent_may_hold_the_session(error: Exception) -> None:
    # GIVEN this VM's session cannot be locked (or its lock was lost)
    client = FakeClient()
    transport = agent(client)
    client.faults.add("receive", error)
    # WHEN the agent receives
    with pytest.raises(TransportUnavailableError, match="another agent with the same VM name"):
        receiver_of(transport).receive_commands(max_wait=1.0)
    # THEN the receiver was closed, and the next receive opens a new one on the same session
    receiver_of(transport).receive_commands(max_wait=1.0)
    first, second = client.receivers
    assert first.closed
    assert not second.closed
    assert second.session_id == VM


def test_the_session_lock_is_renewed_before_it_would_expire() -> None:
    # GIVEN a freshly locked session (60 s)
    client = FakeClient()
    commands = receiver_of(agent(client))
    commands.receive_commands(max_wait=5.0)
    session = client.receivers[0].fake_session
    # THEN a lock far from expiry is left alone
    assert session.renewals == 0
    # WHEN 45 s later the agent is about to wait 5 s more (the lock would end within the margin)
    client.clock.advance(45)
    commands.receive_commands(max_wait=5.0)
    # THEN the lock was renewed first
    assert session.renewals == 1
    assert session.locked_until == client.clock.now() + LOCK_DURATION


def test_settling_after_the_receiver_was_replaced_is_unavailable_not_silent() -> None:
    # GIVEN a received command, then a receive error that replaced the receiver
    client = FakeClient()
    queued_command(client)
    commands = receiver_of(agent(client))
    [inbound] = commands.receive_commands(max_wait=1.0)
    client.faults.add("receive", sb_errors.ServiceBusConnectionError(message="dropped"))
    with pytest.raises(TransportUnavailableError):
        commands.receive_commands(max_wait=1.0)
    # WHEN the old command is settled THEN it says it will be redelivered, and nothing was completed
    with pytest.raises(TransportUnavailableError, match="redelivers"):
        inbound.settle()
    assert client.receivers[0].completed == []


def test_a_failed_complete_is_unavailable_and_can_be_retried_later() -> None:
    # GIVEN a received command whose first completion fails
    client = FakeClient()
    queued_command(client)
    [inbound] = receiver_of(agent(client)).receive_commands(max_wait=1.0)
    client.faults.add("complete", sb_errors.OperationTimeoutError(message="slow"))
    # WHEN settling
    with pytest.raises(TransportUnavailableError):
        inbound.settle()
    # THEN the receiver was dropped (its lock state is unknown) and nothing was completed
    assert client.receivers[0].closed
    assert client.receivers[0].completed == []


# ---------------------------------------------------------------- check()


def test_check_opens_both_links_without_sending_or_receiving() -> None:
    # GIVEN an agent transport
    client = FakeClient()
    transport = agent(client)
    # WHEN it checks
    description = transport.check()
    # THEN the sender and the session receiver were opened (that is where Service Bus authorises),
    # and nothing was sent or received
    [sender] = client.senders
    [receiver] = client.receivers
    assert sender.opened
    assert sender.sent == []
    assert receiver.opened
    assert receiver.receive_calls == []
    assert "maintenance-events" in description
    assert "maintenance-commands" in description


def test_check_names_the_missing_role_for_the_topic() -> None:
    # GIVEN an identity without the sender role
    client = FakeClient()
    client.faults.add("open_sender", sb_errors.ServiceBusAuthorizationError(message="unauthorized"))
    # WHEN the agent checks THEN the error names the role and the topic
    with pytest.raises(TransportConfigError) as failure:
        agent(client).check()
    assert "Azure Service Bus Data Sender" in str(failure.value)
    assert "topic 'maintenance-events'" in str(failure.value)


def test_check_names_a_missing_commands_queue() -> None:
    # GIVEN a commands queue that does not exist
    client = FakeClient()
    client.faults.add("open_receiver", sb_errors.MessagingEntityNotFoundError(message="not found"))
    # WHEN the agent checks THEN the error names the queue and the flag
    with pytest.raises(TransportConfigError) as failure:
        agent(client, commands_queue="typo-commands").check()
    assert "queue 'typo-commands'" in str(failure.value)
    assert "--servicebus-commands-queue" in str(failure.value)


def test_check_says_when_another_agent_holds_the_session() -> None:
    # GIVEN another receiver holds this VM's session
    client = FakeClient()
    client.faults.add("open_receiver", sb_errors.SessionCannotBeLockedError(message="locked"))
    # WHEN the agent checks THEN it is a retryable error that says why
    with pytest.raises(TransportUnavailableError, match="another agent with the same VM name"):
        agent(client).check()


# ---------------------------------------------------------------- the operator's side


def test_a_command_goes_to_the_target_vms_session() -> None:
    # GIVEN the operator's sender
    client = FakeClient()
    # WHEN it sends a command for vm-b
    operator(client).send_command(command("cmd-9", target="vm-b"))
    # THEN the commands queue got a real message in session vm-b, MessageId = command id
    [sender] = client.senders
    assert sender.entity == "queue:maintenance-commands"
    [message] = sender.sent
    assert isinstance(message, ServiceBusMessage)
    assert message.session_id == "vm-b"
    assert message.message_id == "cmd-9"
    assert message.content_type == COMMAND_CONTENT_TYPE
    assert message.application_properties == {"type": "approve", "envelope_id": "cmd-9", "target": "vm-b"}
    assert body_of(message) == command("cmd-9").body


def test_results_are_read_through_the_results_subscription_and_completed() -> None:
    # GIVEN two result envelopes on the results subscription
    client = FakeClient()
    results = [ServiceBusMessage(b'{"n": 1}', message_id="r1"), ServiceBusMessage(b'{"n": 2}', message_id="r2")]
    client.inbox.extend(received(message) for message in results)
    # WHEN the operator reads results
    bodies = operator(client).read_results(max_wait=3.0)
    # THEN it got both bodies, from the events topic's results subscription, each completed
    assert bodies == [b'{"n": 1}', b'{"n": 2}']
    [receiver] = client.receivers
    assert receiver.entity == "subscription:maintenance-events/operator-results"
    assert [message.message_id for message in receiver.completed] == ["r1", "r2"]


def test_results_already_received_are_returned_even_if_completing_fails() -> None:
    # GIVEN a result whose completion fails
    client = FakeClient()
    client.inbox.append(received(ServiceBusMessage(b'{"n": 1}', message_id="r1")))
    client.faults.add("complete", sb_errors.ServiceBusConnectionError(message="dropped"))
    # WHEN the operator reads results THEN the body is still returned (it will come again anyway)
    assert operator(client).read_results(max_wait=3.0) == [b'{"n": 1}']
    assert client.receivers[0].closed


# ---------------------------------------------------------------- the isolated mode: a subscription per VM


def test_the_topic_mode_sender_names_the_target_in_a_property_and_opens_no_session() -> None:
    # GIVEN the sender of the isolated mode (the functions and `mbridge approve` with a commands topic)
    client = FakeClient()
    # WHEN it sends a command for vm-b
    operator(client, commands_topic=COMMANDS_TOPIC).send_command(command("cmd-9", target="vm-b"))
    # THEN the commands topic got a real message with no session, MessageId = command id (the
    # topic's duplicate detection), and the application property the subscriptions filter on
    [sender] = client.senders
    assert sender.entity == "topic:maintenance-commands"
    [message] = sender.sent
    assert isinstance(message, ServiceBusMessage)
    assert message.session_id is None
    assert message.message_id == "cmd-9"
    assert message.content_type == COMMAND_CONTENT_TYPE
    assert message.application_properties == {"type": "approve", "envelope_id": "cmd-9", "target": "vm-b"}
    assert body_of(message) == command("cmd-9").body
    assert sender.timeouts == [7.0]


def test_the_topic_mode_sender_checks_the_topic_and_names_its_role() -> None:
    # GIVEN an operator without Send on the commands topic
    client = FakeClient()
    client.faults.add("open_sender", sb_errors.ServiceBusAuthorizationError(message="unauthorized"))
    # WHEN it checks THEN the error names the role, the topic and the flag
    with pytest.raises(TransportConfigError) as failure:
        operator(client, commands_topic=COMMANDS_TOPIC).check()
    assert "Azure Service Bus Data Sender" in str(failure.value)
    assert "topic 'maintenance-commands'" in str(failure.value)
    # AND a working one says where it sends
    assert "topic 'maintenance-commands'" in operator(FakeClient(), commands_topic=COMMANDS_TOPIC).check()


def test_the_isolated_agent_reads_its_own_subscription_without_a_session() -> None:
    # GIVEN an agent in the isolated mode
    client = FakeClient()
    transport = isolated_agent(client)
    # WHEN it receives
    assert receiver_of(transport).receive_commands(max_wait=5.0) == []
    # THEN it read from its subscription of the commands topic (no session: the fake refuses to
    # give one), up to 10 messages within the wait
    [receiver] = client.receivers
    assert (receiver.entity, receiver.session_id) == ("subscription:maintenance-commands/vm-vm-a", None)
    assert receiver.receive_calls == [(10, 5.0)]


def test_a_command_through_the_topic_reaches_the_agent_as_through_the_queue() -> None:
    # GIVEN a command the topic-mode sender sent, on this VM's subscription, delivered again
    client = FakeClient()
    published_command(client, command("cmd-7"))
    # WHEN the isolated agent receives
    [inbound] = receiver_of(isolated_agent(client)).receive_commands(max_wait=1.0)
    # THEN it carries the bytes sent and text attributes, exactly as the session receiver hands them over
    assert inbound.body == command("cmd-7").body
    assert inbound.attributes == {"type": "approve", "envelope_id": "cmd-7", "target": VM}
    assert inbound.abandon is None


def test_the_isolated_agent_settles_once_through_the_receiver_that_received() -> None:
    # GIVEN a received command whose lock has most of its minute left
    client = FakeClient()
    published_command(client, locked_until=client.clock.now() + LOCK_DURATION)
    [inbound] = receiver_of(isolated_agent(client)).receive_commands(max_wait=1.0)
    [receiver] = client.receivers
    assert receiver.completed == []
    # WHEN it is settled twice
    inbound.settle()
    inbound.settle()
    # THEN it was completed once, and the lock needed no renewal
    assert [message.message_id for message in receiver.completed] == ["cmd-1"]
    assert receiver.renewed_messages == []


def test_a_message_lock_about_to_run_out_is_renewed_before_completing() -> None:
    # GIVEN a received command, then 50 s spent on it (10 s of its lock left)
    client = FakeClient()
    published_command(client, locked_until=client.clock.now() + LOCK_DURATION)
    [inbound] = receiver_of(isolated_agent(client)).receive_commands(max_wait=1.0)
    client.clock.advance(50)
    # WHEN it is settled
    inbound.settle()
    # THEN its lock was renewed first, then it was completed
    [receiver] = client.receivers
    assert receiver.renewed_messages == ["cmd-1"]
    assert [message.message_id for message in receiver.completed] == ["cmd-1"]


def test_a_lost_message_lock_is_unavailable_and_the_command_comes_again() -> None:
    # GIVEN a command whose lock ran out before it was settled (the renewal is refused)
    client = FakeClient()
    published_command(client, locked_until=client.clock.now() + LOCK_DURATION)
    transport = isolated_agent(client)
    [inbound] = receiver_of(transport).receive_commands(max_wait=1.0)
    client.clock.advance(70)
    client.faults.add("renew_message", sb_errors.MessageLockLostError(message="lock expired"))
    # WHEN it is settled THEN it is a retryable error naming the subscription, and nothing was completed
    with pytest.raises(TransportUnavailableError) as failure:
        inbound.settle()
    assert f"subscription 'maintenance-commands/subscriptions/vm-vm-a' in {NAMESPACE}" in str(failure.value)
    assert client.receivers[0].completed == []
    # AND as with sessions the receiver is replaced: the next receive opens a new one
    receiver_of(transport).receive_commands(max_wait=1.0)
    first, second = client.receivers
    assert first.closed
    assert second.entity == first.entity


def test_settling_through_a_replaced_subscription_receiver_is_unavailable_not_silent() -> None:
    # GIVEN a received command, then a receive error that replaced the receiver
    client = FakeClient()
    published_command(client)
    commands = receiver_of(isolated_agent(client))
    [inbound] = commands.receive_commands(max_wait=1.0)
    client.faults.add("receive", sb_errors.ServiceBusConnectionError(message="dropped"))
    with pytest.raises(TransportUnavailableError):
        commands.receive_commands(max_wait=1.0)
    # WHEN the old command is settled THEN it says it will be redelivered, and nothing was completed
    with pytest.raises(TransportUnavailableError, match="redelivers"):
        inbound.settle()
    assert client.receivers[0].completed == []


@pytest.mark.parametrize(
    ("error", "expected", "words"),
    [
        (
            sb_errors.MessagingEntityNotFoundError(message="none"),
            TransportConfigError,
            "--servicebus-commands-subscription",
        ),
        (sb_errors.ServiceBusAuthorizationError(message="no Listen"), TransportConfigError, "Data Receiver"),
        (sb_errors.ServiceBusAuthenticationError(message="bad token"), TransportConfigError, "managed identity"),
        (sb_errors.ServiceBusConnectionError(message="reset"), TransportUnavailableError, "will retry"),
    ],
)
def test_check_of_the_isolated_agent_names_its_subscription(
    error: Exception, expected: type[Exception], words: str
) -> None:
    # GIVEN this VM's subscription cannot be opened
    client = FakeClient()
    client.faults.add("open_receiver", error)
    # WHEN the agent checks THEN the error is ours, names the subscription and what to do
    with pytest.raises(expected) as failure:
        isolated_agent(client).check()
    assert words in str(failure.value)
    assert "subscription 'maintenance-commands/subscriptions/vm-vm-a'" in str(failure.value)
    # AND the receiver is dropped, to be opened anew
    assert client.receivers[0].closed


def test_check_of_the_isolated_agent_opens_both_links_without_moving_a_message() -> None:
    # GIVEN an agent in the isolated mode
    client = FakeClient()
    # WHEN it checks
    description = isolated_agent(client).check()
    # THEN the events sender and the subscription receiver were opened, nothing sent or received
    [sender] = client.senders
    [receiver] = client.receivers
    assert (sender.opened, sender.sent) == (True, [])
    assert (receiver.opened, receiver.receive_calls) == (True, [])
    assert "subscription 'vm-vm-a' of topic 'maintenance-commands'" in description


def test_a_commands_topic_without_a_subscription_is_refused_for_the_agent() -> None:
    # WHEN the agent is given the topic but not its subscription THEN it says what to add
    with pytest.raises(TransportConfigError, match="--servicebus-commands-subscription"):
        agent(FakeClient(), commands_topic=COMMANDS_TOPIC)
    # AND a subscription needs its topic
    with pytest.raises(TransportConfigError, match="--servicebus-commands-topic"):
        agent(FakeClient(), commands_subscription=SUBSCRIPTION)


@pytest.mark.parametrize("field", ["commands_topic", "commands_subscription"])
def test_an_empty_commands_topic_or_subscription_is_refused(field: str) -> None:
    values = {"commands_topic": COMMANDS_TOPIC, "commands_subscription": SUBSCRIPTION, field: " "}
    with pytest.raises(TransportConfigError, match="is empty"):
        settings(**values).validate()


# ---------------------------------------------------------------- the isolated mode: flags and order


def parsed(command_name: str, argv: list[str]) -> argparse.Namespace:
    """`mbridge <command_name>`'s options from `argv` (and the MBRIDGE_* variables they default to)."""
    return build_parser(command_name).parse_args([command_name, *argv])


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No MBRIDGE_* variable but those the test sets."""
    for name in list(os.environ):
        if name.startswith("MBRIDGE_") or name == "AZURE_CLIENT_ID":
            monkeypatch.delenv(name)
    return monkeypatch


# An agent on a cloud bus takes only signed commands: it is given the functions' public key.
AGENT_FLAGS = [
    "--cloud",
    "azure",
    "--transport",
    "servicebus",
    "--servicebus-namespace",
    NAMESPACE,
    "--verify-key",
    generate_keypair()[1].decode(),
]


def test_a_subscription_in_the_environment_puts_the_agent_in_the_isolated_mode(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    # GIVEN an agent's environment naming its own subscription
    clean_environment.setenv("MBRIDGE_SERVICEBUS_COMMANDS_SUBSCRIPTION", "vm-web-0")
    # WHEN the agent reads its settings
    options = settings_from_args(parsed("agent", AGENT_FLAGS))
    # THEN its transport receives from that subscription of the default commands topic
    built = servicebus_settings(options, "web-0")
    assert (built.commands_topic, built.commands_subscription) == ("maintenance-commands", "vm-web-0")
    # AND a topic named on the command line is taken
    options = settings_from_args(parsed("agent", [*AGENT_FLAGS, "--servicebus-commands-topic", "commands-x"]))
    assert servicebus_settings(options, "web-0").commands_topic == "commands-x"


def test_without_a_subscription_the_agent_keeps_its_session_of_the_queue(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    options = settings_from_args(parsed("agent", AGENT_FLAGS))
    built = servicebus_settings(options, "web-0")
    assert (built.commands_topic, built.commands_subscription, built.commands_queue) == (
        None,
        None,
        "maintenance-commands",
    )


def test_the_agent_refuses_a_commands_topic_without_its_subscription(clean_environment: pytest.MonkeyPatch) -> None:
    args = parsed("agent", [*AGENT_FLAGS, "--servicebus-commands-topic", "maintenance-commands"])
    with pytest.raises(ConfigError, match="MBRIDGE_SERVICEBUS_COMMANDS_SUBSCRIPTION"):
        settings_from_args(args)


def test_mbridge_approve_sends_to_the_commands_topic_when_given_one(clean_environment: pytest.MonkeyPatch) -> None:
    # GIVEN `mbridge approve` pointed at the commands topic of an isolated deployment
    clean_environment.setenv("MBRIDGE_SERVICEBUS_COMMANDS_TOPIC", "maintenance-commands")
    flags = ["--event-id", "E1", "--target", "web-0", "--transport", "servicebus", "--servicebus-namespace", NAMESPACE]
    args = parsed("approve", flags)
    # WHEN its Service Bus settings are built THEN commands go to the topic, and no subscription is read
    built = servicebus_settings(args, args.target, args.results_subscription)
    assert (built.commands_topic, built.commands_subscription) == ("maintenance-commands", None)


def test_commands_delivered_out_of_order_are_executed_as_if_in_order(tmp_path: Path) -> None:
    """A subscription without sessions does not promise order. What the agent needs of it: a
    platform event's approval carries execute_at, so it is held until then whatever came first;
    a redelivered command is answered from the ledger, not executed twice."""
    # GIVEN the functions' drain and approve (after a 30 s drain period) for this VM, the approve
    # delivered first, and the drain delivered twice (its first lock ran out)
    clock = FakeClock(T0)
    imds, readiness = FakeImds(), RecordingReadiness()
    imds.add(resources=(VM,))
    drain = new_command(
        CommandType.DRAIN, target=VM, event_id=EVENT_ID, issued_at=T0, expires_at=T0 + timedelta(minutes=10)
    )
    approve = new_command(
        CommandType.APPROVE,
        target=VM,
        event_id=EVENT_ID,
        issued_at=T0,
        execute_at=T0 + timedelta(seconds=30),
        expires_at=T0 + timedelta(minutes=10),
    )
    client = FakeClient()
    for sent in (approve, drain, drain):
        published_command(client, OutboundMessage(sent.command_id, encode_command(sent), VM, {"type": sent.type.value}))
    ledger = CommandLedger(tmp_path / "commands.db", clock=clock)
    processor = CommandProcessor(
        vm_name=VM,
        cloud=Cloud.AZURE,
        ledger=ledger,
        readiness=readiness,
        approver=imds,
        verify_key=None,
        dry_run=False,
        clock=clock,
    )
    try:
        # WHEN the isolated agent receives and handles them as they come, settling each
        results = []
        for inbound in receiver_of(isolated_agent(client)).receive_commands(max_wait=1.0):
            results.append(processor.handle(inbound.body))
            inbound.settle()
        # THEN the VM was drained once, and nothing approved before the drain period
        assert [drained for drained, _ in readiness.calls] == [True]
        assert imds.posts == []
        assert results[0] is None  # the approve is held
        assert results[1] is not None
        assert results[1].accepted
        assert results[2] == results[1]  # the redelivered drain: the stored result
        # AND once its execute_at has come the approval is POSTed, after the drain
        clock.advance(30)
        [approved] = processor.run_due()
        assert approved.accepted
        assert imds.posts == [EVENT_ID]
    finally:
        ledger.close()


# ---------------------------------------------------------------- settings and the real SDK client


def test_settings_need_a_namespace_or_a_connection_string() -> None:
    # WHEN neither is set THEN the error names both flags
    with pytest.raises(TransportConfigError) as failure:
        ServiceBusSettings().validate()
    assert "--servicebus-namespace FQDN" in str(failure.value)
    assert "--servicebus-connection-string" in str(failure.value)


def test_settings_refuse_both_a_namespace_and_a_connection_string() -> None:
    # WHEN both are set THEN exactly one is asked for
    with pytest.raises(TransportConfigError, match="not both"):
        ServiceBusSettings(namespace=NAMESPACE, connection_string=CONNECTION_STRING).validate()


@pytest.mark.parametrize("namespace", ["mbridge-test", CONNECTION_STRING, "my bus.servicebus.windows.net"])
def test_the_namespace_must_be_a_fully_qualified_name(namespace: str) -> None:
    # WHEN the namespace is not an FQDN THEN the error names the flag
    with pytest.raises(TransportConfigError, match="--servicebus-"):
        ServiceBusSettings(namespace=namespace).validate()


def test_the_connection_string_never_appears_in_the_settings_repr() -> None:
    # GIVEN settings with a connection string THEN its key is not printed, and messages show the namespace only
    configured = ServiceBusSettings(connection_string=CONNECTION_STRING)
    assert "SharedAccessKey" not in repr(configured)
    assert configured.endpoint == NAMESPACE


def test_the_agent_transport_needs_the_vm_name() -> None:
    # WHEN the VM name is unknown THEN the transport refuses to start (it is the session)
    with pytest.raises(TransportConfigError, match="VM's name"):
        agent(FakeClient(), vm_name="")


def test_the_default_factory_builds_the_real_sdk_client_from_a_connection_string() -> None:
    # WHEN the real factory gets a syntactically valid connection string
    client = connect(ServiceBusSettings(connection_string=CONNECTION_STRING))
    # THEN it is the SDK's client for that namespace, built without touching the network
    assert isinstance(client, ServiceBusClient)
    assert client.fully_qualified_namespace == NAMESPACE
    client.close()


def test_a_malformed_connection_string_is_a_config_error_that_does_not_leak_it() -> None:
    # WHEN the connection string cannot be parsed
    with pytest.raises(TransportConfigError) as failure:
        connect(ServiceBusSettings(connection_string="SharedAccessKey=secret-value"))
    # THEN the flag is named and the value is not repeated
    assert "--servicebus-connection-string" in str(failure.value)
    assert "secret-value" not in str(failure.value)


class StaticCredential:
    """A TokenCredential that is never asked for a token in these tests (no handler opens)."""

    def __init__(self) -> None:
        self.requested: list[Sequence[str]] = []

    def get_token(
        self,
        *scopes: str,
        claims: str | None = None,
        tenant_id: str | None = None,
        enable_cae: bool = False,
        **kwargs: Any,
    ) -> AccessToken:
        self.requested.append(scopes)
        return AccessToken("token", 0)


def test_the_default_factory_uses_the_namespace_with_an_injected_credential() -> None:
    # GIVEN a namespace and an injected credential (on a VM: the managed identity)
    credential = StaticCredential()
    # WHEN the agent transport is built on the real SDK
    transport = ServiceBusTransport(settings(), credential=credential)
    # THEN it constructs without network or token, and closes cleanly
    assert transport.name == "servicebus"
    assert credential.requested == []
    transport.close()


@pytest.mark.parametrize("isolated", [False, True], ids=["queue", "topic"])
def test_a_resting_agent_closes_its_receiver_and_sender_and_the_next_use_opens_new_ones(isolated: bool) -> None:
    # GIVEN an agent that published and received (one AMQP connection per handler in the SDK)
    client = FakeClient()
    transport = isolated_agent(client) if isolated else agent(client)
    transport.publish(event(1))
    assert transport.commands is not None
    transport.commands.receive_commands(1.0)
    sender, receiver = client.senders[0], client.receivers[0]

    # WHEN it rests (nothing open on this VM)
    transport.rest()

    # THEN both handlers are closed, the client stays usable, and the next use opens new handlers
    assert sender.closed
    assert receiver.closed
    assert not client.closed
    transport.commands.receive_commands(1.0)
    transport.publish(event(2))
    assert [len(client.receivers), len(client.senders)] == [2, 2]
    assert not client.receivers[1].closed
    assert not client.senders[1].closed
    assert [body_of(m) for m in client.senders[1].sent] == [event(2).body]


def test_resting_twice_or_before_any_use_opens_nothing() -> None:
    client = FakeClient()
    transport = agent(client)
    transport.rest()
    transport.rest()
    assert client.senders == []
    assert client.receivers == []


# ---------------------------------------------------------------- commands spread over shards


def test_one_shard_sends_every_command_to_the_configured_entity() -> None:
    # GIVEN the operator with the default single shard
    client = FakeClient()
    sender = operator(client)
    # WHEN it sends commands for several VMs
    for number, vm in enumerate(["vm-0", "vm-1", "vm-2", "vm-3"]):
        sender.send_command(command(f"cmd-{number}", target=vm))
    # THEN one sender to the queue carried them all, each in its VM's session
    [queue] = client.senders
    assert queue.entity == "queue:maintenance-commands"
    assert [message.session_id for message in queue.sent] == ["vm-0", "vm-1", "vm-2", "vm-3"]


@pytest.mark.parametrize(("mode", "kind"), [({}, "queue"), ({"commands_topic": COMMANDS_TOPIC}, "topic")])
def test_each_command_goes_to_its_vms_shard_through_one_sender_per_shard(mode: dict[str, str], kind: str) -> None:
    # GIVEN the operator spreading commands over 8 entities
    client = FakeClient()
    sender = operator(client, commands_shards=8, **mode)
    vms = [f"vm-{i}" for i in range(8)]  # shards 7, 3, 7, 4, 4, 3, 1, 0 (tests/unit/test_shards.py)
    # WHEN it sends two commands to each VM
    for round_ in range(2):
        for vm in vms:
            sender.send_command(command(f"cmd-{round_}-{vm}", target=vm))
    # THEN each command reached the entity of its VM's shard, as the session or the target property says
    by_entity = {handler.entity: handler for handler in client.senders}
    for vm in vms:
        entity = f"{kind}:{entity_for('maintenance-commands', vm, 8)}"
        targets = [(message.application_properties or {})["target"] for message in by_entity[entity].sent]
        assert targets.count(vm) == 2, (vm, entity, targets)
    # AND a sender was opened once per entity used and reused: shard 0 keeps the base name
    assert sorted(by_entity) == sorted(
        f"{kind}:{name}" for name in ("maintenance-commands", *(f"maintenance-commands-{k}" for k in (1, 3, 4, 7)))
    )
    assert len(client.senders) == len(by_entity)
    in_session = [message.session_id for handler in client.senders for message in handler.sent]
    assert all(session is not None for session in in_session) if kind == "queue" else set(in_session) == {None}


def test_a_failed_shard_sender_is_replaced_and_the_others_stay_open() -> None:
    # GIVEN an operator over 8 shards that sent to vm-6 (shard 1) and vm-7 (shard 0)
    client = FakeClient()
    sender = operator(client, commands_shards=8)
    sender.send_command(command("cmd-1", target="vm-6"))
    sender.send_command(command("cmd-2", target="vm-7"))
    first_6, first_7 = client.senders
    # WHEN the next send on shard 1 fails on the connection
    client.faults.add("send", sb_errors.ServiceBusConnectionError(message="dropped"))
    with pytest.raises(TransportUnavailableError):
        sender.send_command(command("cmd-3", target="vm-6"))
    # THEN only that shard's sender was closed; the next command for it opens a new one
    assert (first_6.closed, first_7.closed) == (True, False)
    sender.send_command(command("cmd-4", target="vm-6"))
    sender.send_command(command("cmd-5", target="vm-7"))
    assert [handler.entity for handler in client.senders] == [
        "queue:maintenance-commands-1",
        "queue:maintenance-commands",
        "queue:maintenance-commands-1",
    ]
    assert [message.message_id for message in first_7.sent] == ["cmd-2", "cmd-5"]


class RefusingShard(FakeClient):
    """A namespace where the operator lacks Send on one commands queue."""

    def __init__(self, refused: str) -> None:
        super().__init__()
        self.refused = refused

    def get_queue_sender(self, queue_name: str) -> FakeSender:
        if queue_name == self.refused:
            self.faults.add("open_sender", sb_errors.ServiceBusAuthorizationError(message="unauthorized"))
        return super().get_queue_sender(queue_name)


def test_check_opens_a_sender_to_every_shard_and_names_the_one_refused() -> None:
    # GIVEN an operator over 3 shards
    client = FakeClient()
    # WHEN it checks THEN every shard's sender was opened, nothing sent
    description = operator(client, commands_shards=3).check()
    assert [handler.entity for handler in client.senders] == [
        "queue:maintenance-commands",
        "queue:maintenance-commands-1",
        "queue:maintenance-commands-2",
    ]
    assert all(handler.opened and not handler.sent for handler in client.senders)
    assert "the 3 queues 'maintenance-commands' … 'maintenance-commands-2'" in description
    # AND a shard without the role is named
    with pytest.raises(
        TransportConfigError,
        match=r"Data Sender.*queue 'maintenance-commands-2'|queue 'maintenance-commands-2'.*Data Sender",
    ):
        operator(RefusingShard("maintenance-commands-2"), commands_shards=3).check()


@pytest.mark.parametrize("shards", [0, -1, 1025, True])
def test_a_shard_count_out_of_range_is_refused_naming_the_option(shards: int) -> None:
    with pytest.raises(TransportConfigError, match=r"--commands-shards.*from 1 to 1024"):
        settings(commands_shards=shards).validate()
