"""The Azure scheduled event as the simulator models it: its types, statuses and documented timings,
a validated request to add one, and one held event.

Pure data and constants; the store that moves events through their lifecycle is event_store.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from simulator.clock import rfc1123


class EventType(str, Enum):
    FREEZE = "Freeze"
    REBOOT = "Reboot"
    REDEPLOY = "Redeploy"
    PREEMPT = "Preempt"
    TERMINATE = "Terminate"


class EventStatus(str, Enum):
    SCHEDULED = "Scheduled"
    STARTED = "Started"


class EventSource(str, Enum):
    PLATFORM = "Platform"
    USER = "User"


class ApprovalRule(str, Enum):
    """Whose approval starts a Scheduled event before its NotBefore."""

    ANY = "any"  # one approval from any VM that sees it (a VM alone on its host)
    ALL = "all"  # every VM in Resources: tenants of one host node, which Azure waits for


# Minimum notice by type (documented seconds), from the Scheduled Events "Event scheduling" table.
# Terminate is the scale set's notBeforeTimeout, 5 to 15 minutes; 10 minutes is the docs' own example.
DEFAULT_NOTICE: Mapping[EventType, float] = {
    EventType.FREEZE: 900.0,
    EventType.REBOOT: 900.0,
    EventType.REDEPLOY: 600.0,
    EventType.TERMINATE: 600.0,
    EventType.PREEMPT: 30.0,
}
STARTED_FOR = 600.0  # "Started to Completed (event removed from Events array): 10 minutes"
APPROVAL_START_DELAY = 3.0  # an approval starts the event "within a few seconds"
MIN_STARTED_REAL_SECONDS = 2.0  # so a 1 s poller still sees Started at high --speed
# "Preempt: The Spot Virtual Machine is being deleted"; "Terminate: The virtual machine is scheduled
# to be deleted": once Started, the VMs in Resources are gone (departures.py).
DELETES_ITS_VMS = frozenset({EventType.PREEMPT, EventType.TERMINATE})

DEFAULT_DESCRIPTION: Mapping[EventType, str] = {
    EventType.FREEZE: "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
    EventType.REBOOT: "Virtual machine is going to be restarted because of host maintenance.",
    EventType.REDEPLOY: "Virtual machine is going to be redeployed to another host.",
    EventType.PREEMPT: "Spot virtual machine is being evicted.",
    EventType.TERMINATE: "Virtual machine is going to be deleted.",
}


@dataclass(frozen=True)
class EventSpec:
    """A request to add an event (POST /_sim/events body or a scenario `add` step), validated.

    Names in `resources` and `audience` may still be "$N" references; the caller resolves them.
    """

    event_type: EventType
    resources: tuple[str, ...] | None = None
    event_id: str | None = None
    status: EventStatus = EventStatus.SCHEDULED
    notice: float | None = None
    started_for: float | None = None
    event_source: EventSource = EventSource.PLATFORM
    duration_seconds: int = -1
    description: str | None = None
    audience: tuple[str, ...] | None = None
    approval: ApprovalRule = ApprovalRule.ANY
    keep_serving: bool = False  # the VMs a Preempt/Terminate deletes go on answering


@dataclass(frozen=True)
class SimEvent:
    """One Azure scheduled event as the store holds it; times are documented seconds."""

    event_id: str
    event_type: EventType
    status: EventStatus
    resources: tuple[str, ...]
    description: str
    event_source: EventSource
    duration_seconds: int
    audience: tuple[str, ...]
    started_for: float
    added_at: float
    due_at: float  # the next automatic transition: start (Scheduled) or removal (Started)
    not_before_at: float | None  # when NotBefore is reached (documented s); None once Started
    not_before_epoch: float | None  # that moment in real wall-clock time, as shown to clients
    approval: ApprovalRule = ApprovalRule.ANY
    keep_serving: bool = False
    approvals_from: tuple[str, ...] = ()  # the VMs whose approval counted, in order
    approved_at: float | None = None  # when the approval that starts it arrived
    approved_by: str | None = None
    started_at: float | None = None

    @property
    def not_before(self) -> str:
        if self.status is EventStatus.STARTED or self.not_before_epoch is None:
            return ""
        return rfc1123(self.not_before_epoch)

    def signature(self) -> tuple[object, ...]:
        """Everything a client can see; a change here is a new DocumentIncarnation."""
        return (
            self.event_id,
            self.status,
            self.event_type,
            self.resources,
            self.not_before,
            self.description,
            self.event_source,
            self.duration_seconds,
        )
