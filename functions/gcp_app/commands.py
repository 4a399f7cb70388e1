"""The CommandSender port on Pub/Sub (docs/contracts.md#routing): commands go to the
`maintenance-commands` topic with attribute `target` = VM, which each VM's subscription filters on
(with MBRIDGE_COMMANDS_SHARDS, the topic of the VM's shard: wire.shards).

It reuses the operator side of the agent's Pub/Sub transport (`PubSubOperator.send_command`), so
the functions publish commands exactly as `mbridge approve` does: same attributes, ordering key =
target VM, errors already mapped to RetryableError (bus unavailable) and PermanentError (missing
topic or publisher role).
"""

from __future__ import annotations

from wire.commands import Command, encode_command
from wire.transports.base import CommandSender as BusCommandSender
from wire.transports.base import OutboundMessage


def command_message(command: Command) -> OutboundMessage:
    """The bus message of a command: its canonical bytes, keyed and addressed to its target."""
    return OutboundMessage(
        envelope_id=command.command_id,
        body=encode_command(command),
        key=command.target,
        attributes={"type": command.type.value, "target": command.target, "event_id": command.event_id},
    )


class PubSubCommandSender:
    """CommandSender for `functions.core.process`, over the agent transport's operator."""

    def __init__(self, bus: BusCommandSender) -> None:
        self._bus = bus

    def send(self, command: Command) -> None:
        """Publish and return once Pub/Sub stored the command.

        Raises:
            TransportUnavailableError (a RetryableError): Pub/Sub cannot be reached now.
            TransportConfigError (a PermanentError): missing topic or missing publisher role.
        """
        self._bus.send_command(command_message(command))
