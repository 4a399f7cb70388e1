"""CommandSender onto the Service Bus commands queue (or topic), over the agent's Service Bus transport.

`wire.transports.servicebus.ServiceBusOperator` already sends a command the way agents expect it
(session = target VM on the queue; on the topic of the isolated mode the application property
`target`, which each VM's subscription filters on; MessageId = command_id and the attributes of
docs/contracts.md#routing either way) and maps the SDK's errors (TransportUnavailableError is retryable,
TransportConfigError names the role to grant). With MBRIDGE_COMMANDS_SHARDS the operator sends each
command to the queue or topic of its target's shard (wire.shards), through one sender per entity.
This adapter only turns a `Command` into its message.
"""

from __future__ import annotations

from wire.commands import Command, encode_command
from wire.transports.base import CommandSender as TransportCommandSender
from wire.transports.base import OutboundMessage


class ServiceBusCommandSender:
    """The core's CommandSender on a transport's `send_command` (a ServiceBusOperator in Azure)."""

    def __init__(self, transport: TransportCommandSender) -> None:
        self._transport = transport

    def send(self, command: Command) -> None:
        self._transport.send_command(
            OutboundMessage(
                # MessageId = command_id: the queue's (or topic's) duplicate detection drops a re-sent command.
                envelope_id=command.command_id,
                body=encode_command(command),
                key=command.target,
                attributes={"type": command.type.value, "target": command.target, "event_id": command.event_id},
            )
        )
