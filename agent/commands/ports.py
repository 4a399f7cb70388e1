"""What the command processor needs from the agent around it: readiness to flip, an Azure
Scheduled Events client to approve with, and the error that leaves a command for redelivery.

Protocols, so the processor is written against what it uses and tests hand in small doubles.
"""

from __future__ import annotations

from typing import Protocol

from agent.sources.azure.document import ScheduledEventsDocument
from wire.errors import RetryableError


class Readiness(Protocol):
    """What `drain` / `restore` flip: the agent's `/readyz`."""

    def set_drained(self, drained: bool, reason: str) -> None: ...


class Approver(Protocol):
    """The in-VM Scheduled Events API (AzureImdsClient satisfies it)."""

    def fetch_document(self) -> ScheduledEventsDocument:
        """Raises MetadataUnavailableError when IMDS gives no usable answer."""
        ...

    def post_approval(self, event_id: str) -> None:
        """Raises ApprovalRefusedError (400) or MetadataUnavailableError (transient)."""
        ...


class CommandRetryableError(RetryableError):
    """The command could not be finished now (IMDS unavailable); leave its message unsettled so
    the bus redelivers it. No final result was recorded."""
