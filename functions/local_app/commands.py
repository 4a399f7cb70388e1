"""Commands onto the agent's embedded bus (what the Service Bus / Pub/Sub senders do in the cloud).

The local bus is one database every local agent reads its own commands from: commands shards
(MBRIDGE_COMMANDS_SHARDS, wire.shards) spread the cloud's commands over several queues or topics
to stay within their quotas, and do not apply here. The local host does not read the setting.
"""

from __future__ import annotations

from wire.commands import Command, encode_command
from wire.transports.base import OutboundMessage
from wire.transports.local import LocalBus


class LocalCommandSender:
    def __init__(self, bus: LocalBus) -> None:
        self._bus = bus

    def send(self, command: Command) -> None:
        self._bus.send_command(
            OutboundMessage(
                envelope_id=command.command_id,
                body=encode_command(command),
                key=command.target,
                attributes={"type": command.type.value, "target": command.target, "event_id": command.event_id},
            )
        )
