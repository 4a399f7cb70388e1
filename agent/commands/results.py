"""The results the command handling answers with, and the wording of an expiry, shared by the
checks on receipt and the execution."""

from __future__ import annotations

from datetime import datetime

from wire.commands import Command
from wire.model import CommandResult
from wire.timefmt import format_rfc3339


def accepted(command: Command, reason: str) -> CommandResult:
    return CommandResult(
        command_id=command.command_id, accepted=True, event_id=command.event_id, target=command.target, reason=reason
    )


def rejected(command: Command, reason: str) -> CommandResult:
    return CommandResult(
        command_id=command.command_id, accepted=False, event_id=command.event_id, target=command.target, reason=reason
    )


def expired_reason(command: Command, now: datetime) -> str:
    return f"expired: expires_at {format_rfc3339(command.expires_at)} has passed (now {format_rfc3339(now)})"
