"""How the Azure functions address an agent: MBRIDGE_COMMANDS_MODE (queue | topic).

The queue mode sends into the target VM's session of the commands queue; the topic mode (the
isolated mode of docs/azure.md) sends onto the commands topic with the application property
`target`, which each VM's subscription filters on. The sender is the real ServiceBusOperator over
a fake of the SDK client's senders; the messages are the SDK's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest
from azure.servicebus import ServiceBusMessage

from functions.azure_app import settings as names
from functions.azure_app.commands import ServiceBusCommandSender
from functions.azure_app.settings import Settings, SettingsError
from functions.azure_app.wiring import command_bus_settings
from wire.commands import Command, CommandType, decode_command, new_command
from wire.shards import entity_for
from wire.transports.servicebus import ReceiverLike, ServiceBusOperator, ServiceBusSettings, body_bytes

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
MINIMAL = {
    names.EVENTS_TOPIC: "maintenance-events",
    names.EVENTS_SUBSCRIPTION: "functions",
    names.SERVICEBUS_NAMESPACE: "mybus.servicebus.windows.net",
    names.TABLE_ENDPOINT: "https://myaccount.table.core.windows.net",
    names.TRUST_SUBSCRIPTIONS: "00000000-0000-0000-0000-000000000000",
    names.TRUST_RESOURCE_GROUPS: "rg-web",
}


@dataclass
class _Sender:
    sent: list[ServiceBusMessage]

    def send_messages(self, message: ServiceBusMessage, *, timeout: float | None = None) -> None:
        self.sent.append(message)

    def create_message_batch(self) -> object:
        return object()

    def close(self) -> None:
        pass


@dataclass
class RecordingClient:
    """The SDK client's senders, recording by entity; the functions never receive through it."""

    sent: dict[str, list[ServiceBusMessage]] = field(default_factory=dict)

    def get_queue_sender(self, queue_name: str) -> _Sender:
        return _Sender(self.sent.setdefault(f"queue:{queue_name}", []))

    def get_topic_sender(self, topic_name: str) -> _Sender:
        return _Sender(self.sent.setdefault(f"topic:{topic_name}", []))

    def get_queue_receiver(self, queue_name: str, *, session_id: str | None = None) -> ReceiverLike:
        raise AssertionError("the function app receives no commands")

    def get_subscription_receiver(self, topic_name: str, subscription_name: str) -> ReceiverLike:
        raise AssertionError("the function app reads no command results")

    def close(self) -> None:
        pass


def sender_for(environ: dict[str, str], client: RecordingClient) -> ServiceBusCommandSender:
    """The command sender as the app wires it from its settings, on `client`."""
    bus = command_bus_settings(Settings.from_env(environ))
    return ServiceBusCommandSender(ServiceBusOperator(bus, client_factory=lambda _: client))


def drain(target: str = "web-0") -> Command:
    return new_command(
        CommandType.DRAIN, target=target, event_id="E1", issued_at=NOW, expires_at=NOW + timedelta(minutes=10)
    )


def test_the_queue_is_the_default_and_the_topic_is_named_maintenance_commands() -> None:
    # GIVEN only the required app settings WHEN they are read
    settings = Settings.from_env(MINIMAL)
    # THEN commands go to the session queue; the topic mode would use maintenance-commands
    assert (settings.commands_mode, settings.commands_topic) == ("queue", "maintenance-commands")
    assert command_bus_settings(settings).commands_topic is None


@pytest.mark.parametrize(("value", "mode"), [("topic", "topic"), ("Topic", "topic"), ("queue", "queue"), ("", "queue")])
def test_the_commands_mode_is_read(value: str, mode: str) -> None:
    settings = Settings.from_env({**MINIMAL, names.COMMANDS_MODE: value, names.COMMANDS_TOPIC: "commands-x"})
    assert settings.commands_mode == mode
    assert command_bus_settings(settings).commands_topic == ("commands-x" if mode == "topic" else None)


def test_an_unknown_commands_mode_is_named_in_the_error() -> None:
    with pytest.raises(SettingsError, match="MBRIDGE_COMMANDS_MODE is queue or topic, not 'subscription'"):
        Settings.from_env({**MINIMAL, names.COMMANDS_MODE: "subscription"})


def test_in_queue_mode_a_command_goes_into_the_target_vms_session() -> None:
    # GIVEN the sender of a queue-mode app
    client = RecordingClient()
    # WHEN it sends a drain for web-0
    command = drain()
    sender_for(MINIMAL, client).send(command)
    # THEN the queue got it in web-0's session
    [message] = client.sent["queue:maintenance-commands"]
    assert (message.session_id, message.message_id) == ("web-0", command.command_id)


def test_in_topic_mode_a_command_carries_the_property_the_vm_subscriptions_filter_on() -> None:
    # GIVEN the sender of a topic-mode app
    client = RecordingClient()
    # WHEN it sends a drain for web-0
    command = drain()
    sender_for({**MINIMAL, names.COMMANDS_MODE: "topic"}, client).send(command)
    # THEN only the commands topic got it: no session, MessageId = command_id (the topic's duplicate
    # detection drops a re-sent command), application property target = web-0 (the filter of
    # web-0's subscription), and the command's own bytes as the body
    assert list(client.sent) == ["topic:maintenance-commands"]
    [message] = client.sent["topic:maintenance-commands"]
    assert message.session_id is None
    assert message.message_id == command.command_id
    assert message.application_properties is not None
    assert message.application_properties["target"] == "web-0"
    assert message.application_properties["type"] == "drain"
    assert message.application_properties["event_id"] == "E1"
    sent = decode_command(body_bytes(message.body)).command
    assert (sent.type, sent.target) == (CommandType.DRAIN, "web-0")


def test_the_operator_settings_of_the_topic_mode_validate() -> None:
    # The wiring's settings are valid ServiceBusSettings in both modes.
    for mode in ("queue", "topic"):
        bus = command_bus_settings(Settings.from_env({**MINIMAL, names.COMMANDS_MODE: mode}))
        assert isinstance(bus, ServiceBusSettings)
        bus.validate()


# ---------------------------------------------------------------- MBRIDGE_COMMANDS_SHARDS


@dataclass
class CountingClient(RecordingClient):
    """Also counts the senders the SDK was asked for, by entity."""

    opened: list[str] = field(default_factory=list)

    def get_queue_sender(self, queue_name: str) -> _Sender:
        self.opened.append(f"queue:{queue_name}")
        return super().get_queue_sender(queue_name)

    def get_topic_sender(self, topic_name: str) -> _Sender:
        self.opened.append(f"topic:{topic_name}")
        return super().get_topic_sender(topic_name)


def test_one_commands_shard_is_the_default() -> None:
    settings = Settings.from_env(MINIMAL)
    assert settings.commands_shards == 1
    assert command_bus_settings(settings).commands_shards == 1


@pytest.mark.parametrize("value", ["0", "1025", "four", "2.5", "-1"])
def test_a_shard_count_out_of_range_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(SettingsError, match=r"MBRIDGE_COMMANDS_SHARDS.*from 1 to 1024"):
        Settings.from_env({**MINIMAL, names.COMMANDS_SHARDS: value})


@pytest.mark.parametrize(("mode", "kind"), [("queue", "queue"), ("topic", "topic")])
def test_with_shards_each_command_goes_to_its_vms_entity_through_one_sender_each(mode: str, kind: str) -> None:
    # GIVEN the sender of an app spreading commands over 4 entities, with a queue and a topic of its own
    client = CountingClient()
    environ = {
        **MINIMAL,
        names.COMMANDS_MODE: mode,
        names.COMMANDS_SHARDS: "4",
        names.COMMANDS_QUEUE: "cmds",
        names.COMMANDS_TOPIC: "cmds",
    }
    sender = sender_for(environ, client)
    vms = [f"web-{i}" for i in range(12)]
    # WHEN it sends a drain to every VM, twice
    for _ in range(2):
        for vm in vms:
            sender.send(drain(vm))
    # THEN each VM's drains are on the entity of its shard, in its session on a queue
    for vm in vms:
        entity = f"{kind}:{entity_for('cmds', vm, 4)}"
        mine = [m for m in client.sent[entity] if (m.application_properties or {}).get("target") == vm]
        assert len(mine) == 2, (vm, entity)
        assert {m.session_id for m in mine} == ({vm} if kind == "queue" else {None})
    # AND nothing went anywhere else, through one sender per entity opened once
    assert sorted(client.sent) == sorted({f"{kind}:{entity_for('cmds', vm, 4)}" for vm in vms})
    assert sorted(client.opened) == sorted(client.sent)
    assert sum(len(messages) for messages in client.sent.values()) == 2 * len(vms)
