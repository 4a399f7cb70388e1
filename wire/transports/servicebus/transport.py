"""The agent's Service Bus transport: publishes envelopes to the events topic and receives this VM's
commands (its session of the commands queue, or its own subscription of the commands topic)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Callable

from wire.transports.base import AgentTransport, CommandReceiver, OutboundMessage, TransportConfigError
from wire.transports.servicebus.client import ClientFactory, default_factory
from wire.transports.servicebus.errors import SENDER_ROLE, Entity
from wire.transports.servicebus.handlers import Sending
from wire.transports.servicebus.messages import EVENT_CONTENT_TYPE, outbound
from wire.transports.servicebus.receiving import (
    CommandReceiving,
    ServiceBusCommandReceiver,
    ServiceBusSubscriptionCommandReceiver,
    utc_now,
)
from wire.transports.servicebus.settings import ServiceBusSettings

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential


class ServiceBusTransport(AgentTransport):
    """The agent's transport: publishes envelopes to the topic, receives this VM's commands."""

    name = "servicebus"

    def __init__(
        self,
        settings: ServiceBusSettings,
        *,
        client_factory: ClientFactory | None = None,
        credential: TokenCredential | None = None,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        settings.validate()
        if settings.commands_topic is not None and settings.commands_subscription is None:
            raise TransportConfigError(
                "commands through a topic (--servicebus-commands-topic) are received from this VM's own "
                "subscription of it: set --servicebus-commands-subscription too"
            )
        isolated = settings.commands_subscription is not None
        if not isolated and not settings.vm_name.strip():
            raise TransportConfigError(
                "the servicebus transport needs this VM's name: it is the session the agent receives commands from"
            )
        self._settings = settings
        self._client = (client_factory or default_factory(credential))(settings)
        self._entity = Entity("topic", settings.topic, "--servicebus-topic", SENDER_ROLE, settings.endpoint)
        self._events = Sending(
            lambda: self._client.get_topic_sender(settings.topic), self._entity, settings.operation_timeout
        )
        self._commands: CommandReceiving
        if isolated:
            self._commands = ServiceBusSubscriptionCommandReceiver(self._client, settings, now)
        else:
            self._commands = ServiceBusCommandReceiver(self._client, settings, now)

    def publish(self, message: OutboundMessage) -> None:
        self._events.send(outbound(message, EVENT_CONTENT_TYPE))

    @property
    def commands(self) -> CommandReceiver | None:
        return self._commands

    def check(self) -> str:
        self._events.open()
        self._commands.open()
        settings = self._settings
        if settings.commands_subscription is not None:
            source = f"subscription {settings.commands_subscription!r} of topic {settings.commands_topic!r}"
        else:
            source = f"session {settings.vm_name!r} of queue {settings.commands_queue!r}"
        return (
            f"servicebus: authorised to send to topic {settings.topic!r} and to receive {source} in {settings.endpoint}"
        )

    def rest(self) -> None:
        """Close the command receiver and the events sender: the SDK opens one AMQP connection per
        handler, so an idle agent holds none. The next publish or receive reopens its handler."""
        self._commands.close()
        self._events.close()

    def close(self) -> None:
        self._events.close()
        self._commands.close()
        self._client.close()


def build_agent_transport(
    settings: ServiceBusSettings, *, credential: TokenCredential | None = None
) -> ServiceBusTransport:
    """The agent's Service Bus transport on the real SDK (validates the settings)."""
    return ServiceBusTransport(settings, credential=credential)
