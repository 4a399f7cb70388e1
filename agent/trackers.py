"""Trackers hold each source's last observed state and turn observations into events.

`apply` is side-effect free: it returns what the new state and events would be; the
loop records both in one transaction and only then calls `commit`. So the in-memory
state never runs ahead of what is on disk.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Callable, Generic, Protocol, TypeVar, Union

from agent.diff import (
    GCE_KEYS,
    AzureState,
    GceIdentity,
    GceState,
    azure_state_from_json,
    azure_state_to_json,
    diff_azure,
    diff_gce,
    gce_state_from_json,
    gce_state_to_json,
)
from agent.sources.azure_imds import AzureObservation
from agent.sources.gce_metadata import GceObservation
from functions.core.azure_document import AzureEventStatus, ScheduledEventsDocument
from functions.core.gce_values import MAINTENANCE_EVENT_KEY, PREEMPTED_KEY, MaintenanceValue, parse_maintenance_event
from functions.core.model import EventKind, MaintenanceEvent
from functions.core.policy import DEFAULT_HARMLESS_FREEZE_SECONDS

LOGGER = logging.getLogger("mbridge.agent")

Observation = Union[AzureObservation, GceObservation]
StateT = TypeVar("StateT")

# A Freeze this short is harmless: it does not make the VM unready. The functions' policy holds
# the same threshold (harmless_freeze_seconds, rule 3 of docs/policy.md); set both with
# --harmless-freeze-seconds when the policy changes it.
HARMLESS_FREEZE_SECONDS = DEFAULT_HARMLESS_FREEZE_SECONDS
MAX_REMEMBERED_ODDITIES = 1000


@dataclass(frozen=True)
class Applied(Generic[StateT]):
    state: StateT
    state_json: Any
    events: list[MaintenanceEvent]


# The lowercased EventIds this agent has approved (its command ledger), read when an event goes away.
Approvals = Callable[[], Collection[str]]


def _none_approved() -> Collection[str]:
    return frozenset()


class Tracker(Protocol):
    state_name: str

    def apply(self, observation: Observation) -> Applied[Any]: ...

    def follow_approvals(self, approvals: Approvals) -> None:
        """Where to learn which events this agent approved (an approved event that goes away ran)."""
        ...

    def commit(self, applied: Applied[Any]) -> None: ...

    def impact_pending(self) -> str | None:
        """Why this VM should not take traffic now, or None."""
        ...


class AzureTracker:
    state_name = "azure"

    def __init__(
        self, reporter: str, saved: Any | None, harmless_freeze_seconds: int = HARMLESS_FREEZE_SECONDS
    ) -> None:
        self.reporter = reporter
        self.harmless_freeze_seconds = harmless_freeze_seconds
        self.state: AzureState = azure_state_from_json(saved)
        self._approvals: Approvals = _none_approved
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
        notes = list(document.skipped)
        for event in document.events:
            notes.extend(
                f"event {event.event_id[:80]}: {name} could not be read ({why}); forwarded without it"
                for name, why in event.unreadable.items()
            )
        if len(self._reported_oddities) > MAX_REMEMBERED_ODDITIES:
            self._reported_oddities.clear()  # bounded: a churning document must not grow memory
        for note in notes:
            if note not in self._reported_oddities:
                self._reported_oddities.add(note)
                LOGGER.warning("scheduled events: %s", note)

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


class GceTracker:
    state_name = "gce"

    def __init__(self, identity: GceIdentity, saved: Any | None) -> None:
        self.identity = identity
        self.state: GceState = gce_state_from_json(saved)

    def follow_approvals(self, approvals: Approvals) -> None:
        """GCE has no approvals through the agent (performMaintenance is the functions' call)."""

    def apply(self, observation: Observation) -> Applied[GceState]:
        if not isinstance(observation, GceObservation):
            raise TypeError("a GCE tracker takes GCE observations")
        reading = observation.reading
        state, events = diff_gce(
            self.state,
            key=reading.key,
            value=reading.value,
            sequence=reading.etag,
            observed_at=observation.observed_at,
            identity=self.identity,
        )
        return Applied(state, gce_state_to_json(state), events)

    def commit(self, applied: Applied[Any]) -> None:
        self.state = applied.state

    def impact_pending(self) -> str | None:
        maintenance = self.state.get(MAINTENANCE_EVENT_KEY)
        if maintenance is not None and maintenance.value is not None:
            value = parse_maintenance_event(maintenance.value)
            if value != MaintenanceValue.NONE.value:
                return f"maintenance-event is {value}"
        preempted = self.state.get(PREEMPTED_KEY)
        if preempted is not None and preempted.value == "TRUE":
            return "preempted is TRUE"
        return None


__all__ = ["GCE_KEYS", "Applied", "AzureTracker", "GceTracker", "Observation", "Tracker"]
