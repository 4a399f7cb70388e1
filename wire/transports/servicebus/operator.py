"""The operator's side of Service Bus, what `mbridge approve` and the functions use: sends commands to
the VMs and reads their results from the events topic."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from azure.servicebus import ServiceBusReceivedMessage

from wire.shards import entity_for, sharded_name
from wire.transports.base import CommandSender, OutboundMessage, ResultReader, TransportConfigError
from wire.transports.servicebus.client import ClientFactory, ReceiverLike, default_factory
from wire.transports.servicebus.errors import RECEIVER_ROLE, SENDER_ROLE, Entity, map_error
from wire.transports.servicebus.handlers import Reusable, Sending
from wire.transports.servicebus.messages import COMMAND_CONTENT_TYPE, body_bytes, outbound
from wire.transports.servicebus.settings import ServiceBusSettings

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

LOG = logging.getLogger("mbridge.transport.servicebus")

MAX_RESULTS_PER_READ = 50


class ServiceBusOperator(CommandSender, ResultReader):
    """What `mbridge approve` (and the functions) use: sends a command into the target VM's session
    of the commands queue, or with `commands_topic` onto that topic with the application property
    `target` that the VMs' subscription filters match (with `commands_shards`, the queue or topic
    of the VM's shard, wire.shards); reads command results from the events topic
    through the results subscription (completing what it reads)."""

    def __init__(
        self,
        settings: ServiceBusSettings,
        *,
        client_factory: ClientFactory | None = None,
        credential: TokenCredential | None = None,
    ) -> None:
        settings.validate()
        self._settings = settings
        self._client = (client_factory or default_factory(credential))(settings)
        self._results_entity = Entity(
            "subscription",
            f"{settings.topic}/subscriptions/{settings.results_subscription}",
            "--servicebus-topic",
            RECEIVER_ROLE,
            settings.endpoint,
        )
        # One sender per commands entity, opened on first use and kept: with shards, each VM's commands
        # go to the queue or topic of its shard (wire.shards), and every entity is authorised apart.
        self._commands: dict[str, Sending] = {}
        self._commands_lock = threading.Lock()
        self._results: Reusable[ReceiverLike] = Reusable(
            lambda: self._client.get_subscription_receiver(settings.topic, settings.results_subscription)
        )
        self._lock = threading.Lock()

    def send_command(self, message: OutboundMessage) -> None:
        if not message.key:
            raise TransportConfigError(
                "a command needs a target VM (the message key): it is the queue session, or the property the "
                "subscriptions of the commands topic filter on"
            )
        in_session = self._settings.commands_topic is None
        sending = self._sending(entity_for(self._commands_base, message.key, self._settings.commands_shards))
        sending.send(outbound(message, COMMAND_CONTENT_TYPE, target=message.key, in_session=in_session))

    @property
    def _commands_base(self) -> str:
        """The configured commands topic (the isolated mode) or queue: the name of shard 0."""
        return self._settings.commands_topic or self._settings.commands_queue

    def _commands_entities(self) -> list[str]:
        shards = self._settings.commands_shards
        return [sharded_name(self._commands_base, shard, shards) for shard in range(shards)]

    def _sending(self, name: str) -> Sending:
        """The sender to commands entity `name`, created on first use."""
        with self._commands_lock:
            sending = self._commands.get(name)
            if sending is None:
                sending = self._new_sending(name)
                self._commands[name] = sending
            return sending

    def _new_sending(self, name: str) -> Sending:
        settings, client = self._settings, self._client
        if settings.commands_topic is not None:
            entity = Entity("topic", name, "--servicebus-commands-topic", SENDER_ROLE, settings.endpoint)
            return Sending(lambda: client.get_topic_sender(name), entity, settings.operation_timeout)
        entity = Entity("queue", name, "--servicebus-commands-queue", SENDER_ROLE, settings.endpoint)
        return Sending(lambda: client.get_queue_sender(name), entity, settings.operation_timeout)

    def read_results(self, max_wait: float) -> Sequence[bytes]:
        with self._lock:
            receiver = self._results.get()
            try:
                messages = receiver.receive_messages(max_message_count=MAX_RESULTS_PER_READ, max_wait_time=max_wait)
            except Exception as error:
                mapped = self._results_failed(error, "read command results")
                if mapped is None:
                    raise
                raise mapped from error
            self._complete_all(receiver, messages)
        return [body_bytes(message.body) for message in messages]

    def _complete_all(self, receiver: ReceiverLike, messages: Sequence[ServiceBusReceivedMessage]) -> None:
        # What was received is returned even when completing fails: the uncompleted results come
        # again later, and reading a result twice is harmless to a caller looking for its command.
        for message in messages:
            try:
                receiver.complete_message(message)
            except Exception as error:
                LOG.warning("could not complete command results; they will be read again: %s", error)
                if map_error(error, self._results_entity, "complete command results") is None:
                    raise
                self._results.discard()
                return

    def _results_failed(self, error: Exception, action: str) -> Exception | None:
        mapped = map_error(error, self._results_entity, action)
        if mapped is not None:
            self._results.discard()
        return mapped

    def check(self) -> str:
        """Open the command sender of every shard and the results receiver: each authorises without
        moving a message."""
        entities = self._commands_entities()
        for name in entities:
            self._sending(name).open()
        with self._lock:
            receiver = self._results.get()
            try:
                receiver.__enter__()
            except Exception as error:
                mapped = self._results_failed(error, "open the results subscription")
                if mapped is None:
                    raise
                raise mapped from error
        kind = "topic" if self._settings.commands_topic is not None else "queue"
        if len(entities) == 1:
            destination = f"{kind} {entities[0]!r}"
        else:
            destination = f"the {len(entities)} {kind}s {entities[0]!r} … {entities[-1]!r}"
        return f"servicebus: authorised to send to {destination} and to read {self._results_entity}"

    def close(self) -> None:
        with self._commands_lock:
            senders = list(self._commands.values())
            self._commands.clear()
        for sending in senders:
            sending.close()
        with self._lock:
            self._results.discard()
        self._client.close()


def build_operator(settings: ServiceBusSettings, *, credential: TokenCredential | None = None) -> ServiceBusOperator:
    """The `mbridge approve` side on the real SDK (validates the settings)."""
    return ServiceBusOperator(settings, credential=credential)
