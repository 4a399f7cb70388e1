"""The options of the Pub/Sub transport and their validation (docs/contracts.md#transport-options),
and the emulator the library is pointed at.

Kept apart from the library: the settings are built from flags and checked before any client
exists, and their errors name the flag to set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from wire.shards import validate_shards
from wire.transports.base import TransportConfigError

EMULATOR_VARIABLE = "PUBSUB_EMULATOR_HOST"

# Events go out without an ordering key, and the functions' subscription of the events topic has
# message ordering off (infra/terraform/gcp/pubsub.tf; tests/infra checks it against this). An
# ordering key is whatever the publisher writes, and every agent may publish: a key naming a VM
# would be a lane of that VM's events any agent can fill with junk, each taken and refused by the
# functions one at a time before the genuine event. The functions do not need the order: Service
# Bus and Eventarc keep none, and a step of an ended event is only audited as late
# (docs/transports.md#why-events-carry-no-ordering-key; tests/drills/test_ordering_flood.py).
EVENTS_ORDERING_KEY = ""
EVENTS_SUBSCRIPTION_ORDERED = False


@dataclass(frozen=True)
class PubSubSettings:
    """Options of the Pub/Sub transport (docs/contracts.md#transport-options). Names may also be full
    resource paths (`projects/P/topics/T`), e.g. for a topic in another project. `vm_name` is needed by the agent.

    `commands_shards` > 1 (the publishers of commands: the functions, `mbridge approve`): the
    commands of a VM go to `wire.shards.entity_for(commands_topic, vm, commands_shards)`, one of
    that many topics; the agent reads its own subscription and leaves it at 1."""

    project: str
    topic: str = "maintenance-events"
    commands_topic: str = "maintenance-commands"
    commands_subscription: str | None = None
    results_subscription: str = "operator-results"
    vm_name: str = ""
    operation_timeout: float = 30.0
    commands_shards: int = 1

    def validate(self) -> None:
        """Raise TransportConfigError naming the flag to set when the options cannot work."""
        if not self.project.strip():
            raise TransportConfigError(
                "the pubsub transport needs --pubsub-project (the Google Cloud project id of the topics)"
            )
        for flag, value in (
            ("--pubsub-topic", self.topic),
            ("the commands topic name", self.commands_topic),
            ("the results subscription name", self.results_subscription),
        ):
            if not value.strip():
                raise TransportConfigError(f"{flag} is empty: give the name of the Pub/Sub resource")
        if self.commands_subscription is not None and not self.commands_subscription.strip():
            raise TransportConfigError("--pubsub-commands-subscription is empty: omit it to use the default")
        try:
            validate_shards(self.commands_shards)
        except ValueError as error:
            raise TransportConfigError(f"--commands-shards (MBRIDGE_COMMANDS_SHARDS): {error}") from None
        if self.operation_timeout <= 0:
            raise TransportConfigError(f"the Pub/Sub operation timeout must be positive, not {self.operation_timeout}")

    @property
    def commands_subscription_name(self) -> str:
        """The agent's command subscription: the configured one, or `maintenance-commands-<vm name>`."""
        return self.commands_subscription or f"maintenance-commands-{self.vm_name}"

    def topic_path(self, name: str) -> str:
        return name if name.startswith("projects/") else f"projects/{self.project}/topics/{name}"

    def subscription_path(self, name: str) -> str:
        return name if name.startswith("projects/") else f"projects/{self.project}/subscriptions/{name}"


def emulator_host() -> str | None:
    """The emulator the library talks to, if any (it reads the same variable)."""
    return os.environ.get(EMULATOR_VARIABLE) or None
