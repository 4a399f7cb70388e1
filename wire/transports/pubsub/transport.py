"""The agent's Pub/Sub transport: publishes envelopes to the events topic (no ordering key) and
pulls this VM's commands."""

from __future__ import annotations

from wire.transports.base import AgentTransport, CommandReceiver, OutboundMessage, TransportConfigError
from wire.transports.pubsub.calls import (
    CONSUME_PERMISSION,
    PUBLISH_PERMISSION,
    Clients,
    ensure_allowed,
    ensure_subscription,
    ensure_topic,
    publish_message,
    with_envelope_id,
)
from wire.transports.pubsub.client import PublisherFactory, SubscriberFactory, new_events_publisher, new_subscriber
from wire.transports.pubsub.errors import PUBLISHER_ROLE, Resource
from wire.transports.pubsub.receiving import PubSubCommandReceiver
from wire.transports.pubsub.settings import EVENTS_ORDERING_KEY, PubSubSettings, emulator_host


class PubSubTransport(AgentTransport):
    """The agent's transport: publishes envelopes to the events topic, pulls this VM's commands."""

    name = "pubsub"

    def __init__(
        self,
        settings: PubSubSettings,
        *,
        publisher_factory: PublisherFactory = new_events_publisher,
        subscriber_factory: SubscriberFactory = new_subscriber,
        emulator: bool | None = None,
    ) -> None:
        """`emulator`: None = detect from PUBSUB_EMULATOR_HOST (decides how check() verifies)."""
        settings.validate()
        if not settings.vm_name.strip():
            raise TransportConfigError(
                "the pubsub transport needs this VM's name: commands are addressed to it (attribute target)"
            )
        self._settings = settings
        self._emulator = emulator_host() is not None if emulator is None else emulator
        self._clients = Clients(publisher_factory, subscriber_factory)
        self._events = Resource("topic", settings.topic_path(settings.topic), "--pubsub-topic", PUBLISHER_ROLE)
        self._commands = PubSubCommandReceiver(self._clients, settings)

    def publish(self, message: OutboundMessage) -> None:
        publisher = self._clients.publisher(self._events)
        # No ordering key: any agent could write this VM's name as one and hold up its events
        # behind junk (docs/transports.md#why-events-carry-no-ordering-key).
        publish_message(
            publisher,
            self._events,
            message,
            with_envelope_id(message),
            self._settings.operation_timeout,
            ordering_key=EVENTS_ORDERING_KEY,
        )

    @property
    def commands(self) -> CommandReceiver | None:
        return self._commands

    def check(self) -> str:
        timeout = self._settings.operation_timeout
        publisher = self._clients.publisher(self._events)
        subscriber = self._clients.subscriber(self._commands.resource)
        if self._emulator:
            # The emulator has no IAM (testIamPermissions is UNIMPLEMENTED): check existence instead.
            ensure_topic(publisher, self._events, timeout)
            ensure_subscription(subscriber, self._commands.resource, timeout)
            return f"pubsub (emulator {emulator_host()}): {self._events} and {self._commands.resource} exist"
        ensure_allowed(publisher, self._events, PUBLISH_PERMISSION, timeout)
        ensure_allowed(subscriber, self._commands.resource, CONSUME_PERMISSION, timeout)
        return f"pubsub: allowed to publish to {self._events} and to consume {self._commands.resource}"

    def rest(self) -> None:
        """Close the subscriber's channel; an idle agent pulls nothing. The publisher is kept: a
        publish may be on its way in the publisher's thread, and publishing opens no receive."""
        self._clients.close_subscriber()

    def close(self) -> None:
        self._clients.close()


def build_agent_transport(settings: PubSubSettings) -> PubSubTransport:
    """The agent's Pub/Sub transport on the real library (validates the settings)."""
    return PubSubTransport(settings)
