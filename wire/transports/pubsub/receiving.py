"""The agent's command receiver on Pub/Sub: pulls this VM's commands from its own subscription."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from wire.transports.base import CommandReceiver, InboundCommand, TransportConfigError, TransportUnavailableError
from wire.transports.pubsub.calls import Clients, acknowledge, pull
from wire.transports.pubsub.client import SubscriberLike
from wire.transports.pubsub.errors import SUBSCRIBER_ROLE, Resource
from wire.transports.pubsub.settings import PubSubSettings

LOG = logging.getLogger("mbridge.transport.pubsub")

MAX_COMMANDS_PER_PULL = 10
# A pull may come back empty before its deadline (the service may; the emulator holds it to the
# deadline). The next one goes out no sooner than this after the last began: at most five pulls a
# second when idle, at most this much added to a command's way.
MIN_EMPTY_PULL_SECONDS = 0.2
# The longest one pull is held, whatever the agent asks: the library cannot cut a pull short, so this
# bounds how long a stopping agent's command thread may linger.
MAX_PULL_WAIT_SECONDS = 20.0


class PubSubCommandReceiver(CommandReceiver):
    """Pulls this VM's commands from its subscription; drops (and acknowledges) other VMs' commands."""

    def __init__(self, clients: Clients, settings: PubSubSettings) -> None:
        self._clients = clients
        self._settings = settings
        self.resource = Resource(
            "subscription",
            settings.subscription_path(settings.commands_subscription_name),
            "--pubsub-commands-subscription",
            SUBSCRIBER_ROLE,
        )

    def receive_commands(self, max_wait: float) -> Sequence[InboundCommand]:
        max_wait = min(max_wait, MAX_PULL_WAIT_SECONDS)
        subscriber = self._clients.subscriber(self.resource)
        commands: list[InboundCommand] = []
        foreign: list[str] = []
        began = time.monotonic()
        pulled = pull(subscriber, self.resource, MAX_COMMANDS_PER_PULL, max_wait)
        if not pulled:
            time.sleep(max(0.0, began + min(max_wait, MIN_EMPTY_PULL_SECONDS) - time.monotonic()))
        for received in pulled:
            attributes = dict(received.message.attributes)
            if attributes.get("target") != self._settings.vm_name:
                LOG.info(
                    "dropping a command for target %r on %s: this VM is %r (subscription filters are not applied)",
                    attributes.get("target"),
                    self.resource,
                    self._settings.vm_name,
                )
                foreign.append(received.ack_id)
                continue
            commands.append(self._command(subscriber, received, attributes))
        self._drop(subscriber, foreign)
        return commands

    def interrupt(self) -> None:
        """Nothing to do: a pull cannot be cut short; it ends within MAX_PULL_WAIT_SECONDS."""

    def _command(self, subscriber: SubscriberLike, received: Any, attributes: dict[str, str]) -> InboundCommand:
        ack_id: str = received.ack_id
        attempt: int = received.delivery_attempt

        def settle() -> None:
            acknowledge(subscriber, self.resource, [ack_id], self._settings.operation_timeout)

        return InboundCommand(
            body=bytes(received.message.data),
            attributes=attributes,
            settle=settle,
            # Pub/Sub counts delivery attempts only on subscriptions with a dead-letter policy; 0 otherwise.
            delivery_count=attempt or None,
        )

    def _drop(self, subscriber: SubscriberLike, ack_ids: list[str]) -> None:
        if not ack_ids:
            return
        try:
            acknowledge(subscriber, self.resource, ack_ids, self._settings.operation_timeout)
        except (TransportUnavailableError, TransportConfigError) as error:
            # Not fatal: they come back after the ack deadline and are dropped again.
            LOG.warning("could not acknowledge %d dropped command(s): %s", len(ack_ids), error)
