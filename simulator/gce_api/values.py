"""The GCE metadata values the simulator serves per VM, and a validated change to them.

Pure data: `GceState` (state.py) holds and changes these, `parse_gce_change` (changes.py) builds
the change from a control-API body or scenario step.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TypedDict


class GceKey(str, Enum):
    MAINTENANCE_EVENT = "maintenance-event"
    UPCOMING_MAINTENANCE = "upcoming-maintenance"
    PREEMPTED = "preempted"


class MaintenanceEvent(str, Enum):
    NONE = "NONE"
    MIGRATE = "MIGRATE_ON_HOST_MAINTENANCE"
    TERMINATE = "TERMINATE_ON_HOST_MAINTENANCE"


class UpcomingJson(TypedDict):
    """instance/upcoming-maintenance, keys in the documented order; canReschedule is a string there."""

    maintenanceType: str
    canReschedule: str
    latestWindowStartTime: str
    maintenanceStatus: str
    windowEndTime: str
    windowStartTime: str


@dataclass(frozen=True)
class UpcomingPatch:
    """Fields to set on upcoming-maintenance; unset ones keep their value (or the default when new).

    Window times are either given verbatim (RFC 3339) or relative, in documented seconds from the
    moment the change is applied (`window_start_in`, `window_length`).
    """

    maintenance_type: str | None = None
    can_reschedule: bool | None = None
    maintenance_status: str | None = None
    window_start_in: float | None = None
    window_length: float | None = None
    window_start_time: str | None = None
    window_end_time: str | None = None
    latest_window_start_time: str | None = None


@dataclass(frozen=True)
class GceChange:
    """A POST /_sim/gce body (also a scenario `gce` step), validated."""

    key: GceKey
    vm: str | None = None
    maintenance_event: MaintenanceEvent | None = None
    preempted: bool | None = None
    upcoming: UpcomingPatch | None = None  # None with key upcoming-maintenance removes it
    require_watch: bool = True
    keep_serving: bool = False  # a preempted VM is not shut down


@dataclass(frozen=True)
class VmMetadata:
    maintenance_event: MaintenanceEvent = MaintenanceEvent.NONE
    upcoming: UpcomingJson | None = None
    preempted: bool = False
    watched: bool = False  # maintenance-event queried directly since the last maintenance event
