"""The options of the Service Bus transport and their validation (docs/contracts.md#transport-options).

Kept apart from the SDK: the settings are built from flags and checked before any client exists, and
their errors name the flag to set.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wire.shards import validate_shards
from wire.transports.base import TransportConfigError


@dataclass(frozen=True)
class ServiceBusSettings:
    """Options of the Service Bus transport (docs/contracts.md#transport-options). Exactly one of `namespace` (managed
    identity) and `connection_string` (SAS) is set; `vm_name` is needed by the agent only.

    `commands_topic` set: commands travel through that topic instead of the session queue (the
    isolated mode); the agent then receives from its own subscription `commands_subscription`.

    `commands_shards` > 1 (the senders' side: the functions, `mbridge approve`): the commands of a
    VM go to `wire.shards.entity_for(<queue or topic>, vm, commands_shards)`, one of that many
    queues or topics. The agent is given its own entity's name and leaves it at 1.
    """

    namespace: str | None = None
    # repr=False: a connection string carries the shared access key.
    connection_string: str | None = field(default=None, repr=False)
    topic: str = "maintenance-events"
    commands_queue: str = "maintenance-commands"
    results_subscription: str = "operator-results"
    vm_name: str = ""
    operation_timeout: float = 30.0
    commands_topic: str | None = None
    commands_subscription: str | None = None
    commands_shards: int = 1

    def validate(self) -> None:
        """Raise TransportConfigError naming the flag to set when the options cannot work."""
        if self.namespace and self.connection_string:
            raise TransportConfigError(
                "set either --servicebus-namespace FQDN (managed identity) or --servicebus-connection-string, not both"
            )
        if not self.namespace and not self.connection_string:
            raise TransportConfigError(
                "the servicebus transport needs --servicebus-namespace FQDN (managed identity, e.g. "
                "mybus.servicebus.windows.net) or --servicebus-connection-string"
            )
        if self.namespace is not None:
            _validate_namespace(self.namespace)
        names = [
            ("--servicebus-topic", self.topic),
            ("--servicebus-commands-queue", self.commands_queue),
            ("the results subscription name", self.results_subscription),
        ]
        if self.commands_topic is not None:
            names.append(("--servicebus-commands-topic", self.commands_topic))
        if self.commands_subscription is not None:
            names.append(("--servicebus-commands-subscription", self.commands_subscription))
        for flag, value in names:
            if not value.strip():
                raise TransportConfigError(f"{flag} is empty: give the name of the Service Bus entity")
        if self.commands_subscription is not None and self.commands_topic is None:
            raise TransportConfigError(
                "--servicebus-commands-subscription names a subscription of the commands topic: "
                "give the topic too (--servicebus-commands-topic, default maintenance-commands)"
            )
        _validate_shards(self.commands_shards)
        if self.operation_timeout <= 0:
            raise TransportConfigError(
                f"the Service Bus operation timeout must be positive, not {self.operation_timeout}"
            )

    @property
    def endpoint(self) -> str:
        """The namespace, for messages; never the connection string (it holds a key)."""
        if self.namespace:
            return self.namespace
        return _namespace_of(self.connection_string or "") or "the namespace of the connection string"


def _validate_shards(shards: int) -> None:
    try:
        validate_shards(shards)
    except ValueError as error:
        raise TransportConfigError(f"--commands-shards (MBRIDGE_COMMANDS_SHARDS): {error}") from None


def _validate_namespace(namespace: str) -> None:
    if namespace.lower().startswith("endpoint="):
        raise TransportConfigError(
            "--servicebus-namespace got a connection string: pass it with --servicebus-connection-string instead"
        )
    if "." not in namespace or any(character.isspace() for character in namespace):
        raise TransportConfigError(
            f"--servicebus-namespace takes the fully qualified namespace, e.g. mybus.servicebus.windows.net, "
            f"not {namespace!r}"
        )


def _namespace_of(connection_string: str) -> str | None:
    for part in connection_string.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "endpoint":
            return value.strip().removeprefix("sb://").rstrip("/")
    return None
