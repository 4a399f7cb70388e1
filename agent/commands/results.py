"""The results the command handling answers with, and the wording of an expiry, shared by the
checks on receipt and the execution."""

from __future__ import annotations

from datetime import datetime

from wire.commands import Command
from wire.model import CommandResult
from wire.timefmt import format_rfc3339


def accepted(command: Command, reason: str) -> CommandResult:
    return _result(command, True, reason)


def rejected(command: Command, reason: str) -> CommandResult:
    return _result(command, False, reason)


def _result(command: Command, accepted: bool, reason: str) -> CommandResult:
    return CommandResult(
        command_id=command.command_id,
        accepted=accepted,
        event_id=command.event_id,
        target=command.target,
        reason=reason,
        trace_id=trace_id_of(command),
    )


def trace_id_of(command: Command) -> str:
    """The trace id the command carried, or ""."""
    return command.trace.trace_id if command.trace is not None else ""


def expired_reason(command: Command, now: datetime) -> str:
    return f"expired: expires_at {format_rfc3339(command.expires_at)} has passed (now {format_rfc3339(now)})"
