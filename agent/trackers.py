"""Trackers hold each source's last observed state and turn observations into events.

`apply` is side-effect free: it returns what the new state and events would be; the
loop records both in one transaction and only then calls `commit`. So the in-memory
state never runs ahead of what is on disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, Union

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
from functions.core.azure_document import AzureEventStatus
from functions.core.gce_values import MAINTENANCE_EVENT_KEY, PREEMPTED_KEY, parse_maintenance_event
from functions.core.model import EventKind, MaintenanceEvent

Observation = Union[AzureObservation, GceObservation]
StateT = TypeVar("StateT")

# A Freeze this short is harmless (design §3.4, rule 3): it does not make the VM unready.
HARMLESS_FREEZE_SECONDS = 10


@dataclass(frozen=True)
class Applied(Generic[StateT]):
    state: StateT
    state_json: Any
    events: list[MaintenanceEvent]


class Tracker(Protocol):
    state_name: str

    def apply(self, observation: Observation) -> Applied[Any]: ...

    def commit(self, applied: Applied[Any]) -> None: ...

    def impact_pending(self) -> str | None:
        """Why this VM should not take traffic now, or None."""
        ...


class AzureTracker:
    state_name = "azure"

    def __init__(self, reporter: str, saved: Any | None) -> None:
        self.reporter = reporter
        self.state: AzureState = azure_state_from_json(saved)

    def apply(self, observation: Observation) -> Applied[AzureState]:
        if not isinstance(observation, AzureObservation):
            raise TypeError("an Azure tracker takes Azure observations")
        state, events = diff_azure(self.state, observation.document, reporter=self.reporter)
        return Applied(state, azure_state_to_json(state), events)

    def commit(self, applied: Applied[Any]) -> None:
        self.state = applied.state

    def impact_pending(self) -> str | None:
        for event in self.state.values():
            if self.reporter not in event.resources:
                continue
            harmless = (
                event.kind is EventKind.FREEZE
                and event.duration_seconds is not None
                and 0 <= event.duration_seconds <= HARMLESS_FREEZE_SECONDS
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
            if value.value != "NONE":
                return f"maintenance-event is {value.value}"
        preempted = self.state.get(PREEMPTED_KEY)
        if preempted is not None and preempted.value == "TRUE":
            return "preempted is TRUE"
        return None


__all__ = ["GCE_KEYS", "Applied", "AzureTracker", "GceTracker", "Observation", "Tracker"]
