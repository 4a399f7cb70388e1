"""The operator's side of Pub/Sub, what `mbridge approve` uses: publishes commands to the VMs and
reads their results from the events topic."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from wire.shards import entity_for, sharded_name
from wire.transports.base import (
    CommandSender,
    OutboundMessage,
    ResultReader,
    TransportConfigError,
    TransportUnavailableError,
)
from wire.transports.pubsub.calls import (
    CONSUME_PERMISSION,
    PUBLISH_PERMISSION,
    Clients,
    acknowledge,
    ensure_allowed,
    ensure_subscription,
    ensure_topic,
    publish_message,
    pull,
    with_envelope_id,
)
from wire.transports.pubsub.client import PublisherFactory, SubscriberFactory, new_commands_publisher, new_subscriber
from wire.transports.pubsub.errors import PUBLISHER_ROLE, SUBSCRIBER_ROLE, Resource
from wire.transports.pubsub.settings import PubSubSettings, emulator_host

LOG = logging.getLogger("mbridge.transport.pubsub")

MAX_RESULTS_PER_PULL = 50


class PubSubOperator(CommandSender, ResultReader):
    """What `mbridge approve` uses: publishes a command with attribute `target` (on the commands topic
    of the target's shard, wire.shards, when `commands_shards` > 1), and reads command
    results from the events topic through the results subscription (acknowledging what it reads)."""

    def __init__(
        self,
        settings: PubSubSettings,
        *,
        publisher_factory: PublisherFactory = new_commands_publisher,
        subscriber_factory: SubscriberFactory = new_subscriber,
        emulator: bool | None = None,
    ) -> None:
        settings.validate()
        self._settings = settings
        self._emulator = emulator_host() is not None if emulator is None else emulator
        self._clients = Clients(publisher_factory, subscriber_factory)
        # The commands topic of each shard (wire.shards), made on first use; one publisher client
        # publishes to all of them.
        self._commands: dict[str, Resource] = {}
        self._commands_lock = threading.Lock()
        self._results = Resource(
            "subscription",
            settings.subscription_path(settings.results_subscription),
            "the results subscription name",
            SUBSCRIBER_ROLE,
        )

    def send_command(self, message: OutboundMessage) -> None:
        if not message.key:
            raise TransportConfigError("a command needs a target VM (the message key): it is the attribute target")
        settings = self._settings
        resource = self._topic(entity_for(settings.commands_topic, message.key, settings.commands_shards))
        publisher = self._clients.publisher(resource)
        attributes = with_envelope_id(message, target=message.key)
        publish_message(publisher, resource, message, attributes, settings.operation_timeout, ordering_key=message.key)

    def _topic(self, name: str) -> Resource:
        """Commands topic `name` (a shard's), as the resource errors name."""
        with self._commands_lock:
            resource = self._commands.get(name)
            if resource is None:
                path = self._settings.topic_path(name)
                resource = Resource("topic", path, "the commands topic name", PUBLISHER_ROLE)
                self._commands[name] = resource
            return resource

    def _commands_topics(self) -> list[Resource]:
        shards = self._settings.commands_shards
        return [self._topic(sharded_name(self._settings.commands_topic, shard, shards)) for shard in range(shards)]

    def read_results(self, max_wait: float) -> Sequence[bytes]:
        subscriber = self._clients.subscriber(self._results)
        received = pull(subscriber, self._results, MAX_RESULTS_PER_PULL, max_wait)
        if received:
            try:
                acknowledge(
                    subscriber, self._results, [item.ack_id for item in received], self._settings.operation_timeout
                )
            except (TransportUnavailableError, TransportConfigError) as error:
                # What was pulled is still returned; the results come again after the ack deadline.
                LOG.warning("could not acknowledge %d command result(s): %s", len(received), error)
        return [bytes(item.message.data) for item in received]

    def check(self) -> str:
        timeout = self._settings.operation_timeout
        topics = self._commands_topics()
        publisher = self._clients.publisher(topics[0])
        subscriber = self._clients.subscriber(self._results)
        commands = str(topics[0]) if len(topics) == 1 else f"the {len(topics)} topics {topics[0]} … {topics[-1].path}"
        if self._emulator:
            for resource in topics:
                ensure_topic(publisher, resource, timeout)
            ensure_subscription(subscriber, self._results, timeout)
            return f"pubsub (emulator {emulator_host()}): {commands} and {self._results} exist"
        for resource in topics:
            ensure_allowed(publisher, resource, PUBLISH_PERMISSION, timeout)
        ensure_allowed(subscriber, self._results, CONSUME_PERMISSION, timeout)
        return f"pubsub: allowed to publish to {commands} and to consume {self._results}"

    def close(self) -> None:
        self._clients.close()


def build_operator(settings: PubSubSettings) -> PubSubOperator:
    """The `mbridge approve` side on the real library (validates the settings)."""
    return PubSubOperator(settings)
