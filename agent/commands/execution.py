"""Carrying out one due command: drain and restore flip readiness; an approval re-validates against
a fresh Scheduled Events document and POSTs once.

Kept apart from the processor, which decides whether a command runs at all (target, signature,
replay, expiry, hold): this is what it does once it runs.
"""

from __future__ import annotations

from agent.commands.ports import Approver, CommandRetryableError, Readiness
from agent.commands.results import accepted, expired_reason, rejected
from agent.sources.azure.client import ApprovalRefusedError
from agent.sources.azure.document import AzureEventStatus, AzureScheduledEvent
from agent.sources.http import MetadataUnavailableError
from agent.timing import Clock
from wire.commands import Command, CommandType
from wire.model import Cloud, CommandResult


class CommandExecutor:
    """Runs a command the processor found due; its result is final (or CommandRetryableError)."""

    def __init__(
        self,
        *,
        vm_name: str,
        cloud: Cloud,
        readiness: Readiness,
        approver: Approver | None,
        dry_run: bool,
        clock: Clock,
    ) -> None:
        self._vm_name = vm_name
        self._cloud = cloud
        self._readiness = readiness
        self._approver = approver
        self._dry_run = dry_run
        self._clock = clock

    def run(self, command: Command, attempt: int) -> CommandResult:
        now = self._clock.now()
        if now >= command.expires_at:
            return rejected(command, expired_reason(command, now))
        if command.type is CommandType.DRAIN:
            self._readiness.set_drained(True, f"drain command {command.command_id} (event {command.event_id})")
            return accepted(command, "drained: /readyz now reports unready")
        if command.type is CommandType.RESTORE:
            self._readiness.set_drained(False, f"restore command {command.command_id} (event {command.event_id})")
            return accepted(command, "restored: /readyz reports ready again")
        return self._approve(command, attempt)

    def _approve(self, command: Command, attempt: int) -> CommandResult:
        if self._cloud is Cloud.GCE:
            return rejected(command, "GCE has no in-VM approval; the function uses instances.performMaintenance")
        if self._approver is None:
            return rejected(
                command, "this agent has no Scheduled Events client to approve with; run it with the Azure source"
            )
        event = self._fresh_event(command, self._approver)
        if event is None:
            return rejected(
                command,
                f"event {command.event_id} is not in the current Scheduled Events document "
                "(canceled, completed, or never shown to this VM)",
            )
        refusal = self._event_refusal(event, attempt)
        if refusal is not None:
            return rejected(command, refusal)
        now = self._clock.now()
        if now >= command.expires_at:  # the document fetch may have taken a while
            return rejected(command, expired_reason(command, now))
        if self._dry_run:
            return accepted(command, f"dry run: would have approved {event.event_id}")
        try:
            self._approver.post_approval(event.event_id)
        except ApprovalRefusedError as exc:
            return rejected(command, str(exc))
        except MetadataUnavailableError as exc:
            raise CommandRetryableError(
                f"approve command {command.command_id}: POST to IMDS failed ({exc.kind}: {exc}); no result recorded, "
                "leave the command unsettled so it is redelivered (the retry re-validates, and Azure answers 200 "
                "for an event that is already approved)"
            ) from exc
        return accepted(command, f"approved: StartRequests POSTed for {event.event_id}")

    def _fresh_event(self, command: Command, approver: Approver) -> AzureScheduledEvent | None:
        try:
            document = approver.fetch_document()
        except MetadataUnavailableError as exc:
            raise CommandRetryableError(
                f"approve command {command.command_id}: cannot read the Scheduled Events document "
                f"({exc.kind}: {exc}); nothing was POSTed, leave the command unsettled so it is redelivered"
            ) from exc
        return document.by_id().get(command.event_id.lower())

    def _event_refusal(self, event: AzureScheduledEvent, attempt: int) -> str | None:
        if event.status is AzureEventStatus.STARTED:
            earlier = " (an earlier attempt of this command may have approved it)" if attempt > 1 else ""
            return f"event {event.event_id} is already Started{earlier}"
        if event.status is not AzureEventStatus.SCHEDULED:
            # Strict where it matters: only an event IMDS plainly shows as Scheduled is approved.
            return f"event {event.event_id} is not Scheduled ({event.unreadable.get('EventStatus', 'status unknown')})"
        if self._vm_name not in event.resources:
            return (
                f"this VM is not in Resources of event {event.event_id} ({self._vm_name} not in "
                f"{', '.join(event.resources) or 'an empty list'}): only a VM the event concerns approves it"
            )
        return None
