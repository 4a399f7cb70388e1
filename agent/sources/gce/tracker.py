"""The GCE tracker: the last value of each maintenance key, and what each new value changes."""

from __future__ import annotations

from typing import Any

from agent.sources.gce.client import GceObservation
from agent.sources.gce.diff import GceIdentity, GceState, diff_gce, gce_state_from_json, gce_state_to_json
from agent.sources.gce.values import MaintenanceValue, parse_maintenance_event
from agent.sources.tracking import Applied, Approvals, Observation
from wire.gce_ids import MAINTENANCE_EVENT_KEY, PREEMPTED_KEY


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
