"""Building the cloud transports from the shared transport flags (docs/contracts.md#transport-options).

`mbridge agent` passes its settings, `mbridge approve` its parsed arguments: both carry the
same option names. Each SDK is imported here only when its transport was chosen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from wire.transports.base import AgentTransport, TransportConfigError

if TYPE_CHECKING:
    from wire.transports.pubsub import PubSubSettings
    from wire.transports.servicebus import ServiceBusSettings


class TransportOptions(Protocol):
    """The transport flags, read-only (AgentSettings and argparse namespaces both fit)."""

    @property
    def transport(self) -> str: ...
    @property
    def servicebus_namespace(self) -> str | None: ...
    @property
    def servicebus_connection_string(self) -> str | None: ...
    @property
    def servicebus_topic(self) -> str: ...
    @property
    def servicebus_commands_queue(self) -> str: ...
    @property
    def servicebus_commands_subscription(self) -> str | None: ...
    @property
    def servicebus_commands_topic(self) -> str | None: ...
    @property
    def commands_shards(self) -> int: ...
    @property
    def pubsub_project(self) -> str | None: ...
    @property
    def pubsub_topic(self) -> str: ...
    @property
    def pubsub_commands_subscription(self) -> str | None: ...


DEFAULT_RESULTS_SUBSCRIPTION = "operator-results"
# The commands topic of the isolated mode (one subscription per VM); it takes the queue's name.
DEFAULT_COMMANDS_TOPIC = "maintenance-commands"


def servicebus_settings(
    options: TransportOptions, vm_name: str, results_subscription: str = DEFAULT_RESULTS_SUBSCRIPTION
) -> ServiceBusSettings:
    from wire.transports.servicebus import ServiceBusSettings

    # The isolated mode: a subscription names this VM's own subscription of the commands topic (the
    # agent), a topic alone says where to send commands (`mbridge approve`). Neither: the queue.
    subscription = options.servicebus_commands_subscription or None
    topic = options.servicebus_commands_topic or (DEFAULT_COMMANDS_TOPIC if subscription else None)
    settings = ServiceBusSettings(
        namespace=options.servicebus_namespace,
        connection_string=options.servicebus_connection_string,
        topic=options.servicebus_topic,
        commands_queue=options.servicebus_commands_queue,
        results_subscription=results_subscription,
        vm_name=vm_name,
        commands_topic=topic,
        commands_subscription=subscription,
        commands_shards=options.commands_shards,
    )
    settings.validate()
    return settings


def pubsub_settings(
    options: TransportOptions, vm_name: str, results_subscription: str = DEFAULT_RESULTS_SUBSCRIPTION
) -> PubSubSettings:
    from wire.transports.pubsub import PubSubSettings

    settings = PubSubSettings(
        project=options.pubsub_project or "",
        topic=options.pubsub_topic,
        commands_subscription=options.pubsub_commands_subscription,
        results_subscription=results_subscription,
        vm_name=vm_name,
        commands_shards=options.commands_shards,
    )
    settings.validate()
    return settings


def build_cloud_transport(options: TransportOptions, vm_name: str) -> AgentTransport:
    if options.transport == "servicebus":
        from wire.transports import servicebus

        return servicebus.build_agent_transport(servicebus_settings(options, vm_name))
    if options.transport == "pubsub":
        from wire.transports import pubsub

        return pubsub.build_agent_transport(pubsub_settings(options, vm_name))
    raise TransportConfigError(f"unknown transport {options.transport!r}: choose jsonl, local, servicebus or pubsub")
