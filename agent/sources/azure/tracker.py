"""The Azure tracker: the last Scheduled Events document seen, and what each new one changes."""

from __future__ import annotations

import logging
from typing import Any

from agent import logs
from agent.sources.azure.client import AzureObservation
from agent.sources.azure.diff import AzureState, azure_state_from_json, azure_state_to_json, diff_azure
from agent.sources.azure.document import AzureEventStatus, ScheduledEventsDocument
from agent.sources.tracking import Applied, Approvals, Observation, none_approved
from wire.model import DEFAULT_HARMLESS_FREEZE_SECONDS, Cloud, EventKind

LOGGER = logging.getLogger("mbridge.agent")

MAX_REMEMBERED_ODDITIES = 1000


class AzureTracker:
    state_name = "azure"

    def __init__(
        self, reporter: str, saved: Any | None, harmless_freeze_seconds: int = DEFAULT_HARMLESS_FREEZE_SECONDS
    ) -> None:
        self.reporter = reporter
        self.harmless_freeze_seconds = harmless_freeze_seconds
        self.state: AzureState = azure_state_from_json(saved)
        self._approvals: Approvals = none_approved
        self._reported_oddities: set[str] = set()

    def follow_approvals(self, approvals: Approvals) -> None:
        self._approvals = approvals

    def apply(self, observation: Observation) -> Applied[AzureState]:
        if not isinstance(observation, AzureObservation):
            raise TypeError("an Azure tracker takes Azure observations")
        document = observation.document
        gone = set(self.state) - set(document.by_id())
        approved = {key for key in self._approvals() if key in gone} if gone else set()
        state, events = diff_azure(
            self.state, document, reporter=self.reporter, observed_at=observation.observed_at, approved=approved
        )
        self._report_oddities(document)
        return Applied(state, azure_state_to_json(state), events)

    def _report_oddities(self, document: ScheduledEventsDocument) -> None:
        """Log each entry left out and each field that could not be read once, with the reason: the
        document is read again every time it changes, and the log must not repeat itself."""
        # (note, the event it is about, when it has an id)
        notes: list[tuple[str, str | None]] = [(skipped, None) for skipped in document.skipped]
        for event in document.events:
            notes.extend(
                (f"event {event.event_id[:80]}: {name} could not be read ({why}); forwarded without it", event.event_id)
                for name, why in event.unreadable.items()
            )
        if len(self._reported_oddities) > MAX_REMEMBERED_ODDITIES:
            self._reported_oddities.clear()  # bounded: a churning document must not grow memory
        for note, event_id in notes:
            if note not in self._reported_oddities:
                self._reported_oddities.add(note)
                LOGGER.warning(
                    "scheduled events: %s",
                    note,
                    extra=logs.fields(event_id=event_id, cloud=Cloud.AZURE.value, vm=self.reporter),
                )

    def commit(self, applied: Applied[Any]) -> None:
        self.state = applied.state

    def impact_pending(self) -> str | None:
        for event in self.state.values():
            if self.reporter not in event.resources:
                continue
            harmless = (
                event.kind is EventKind.FREEZE
                and event.duration_seconds is not None
                and 0 <= event.duration_seconds <= self.harmless_freeze_seconds
            )
            if not harmless:
                status = "started" if event.status is AzureEventStatus.STARTED else "scheduled"
                return f"{event.kind.value} {event.event_id} {status} for this VM"
        return None
