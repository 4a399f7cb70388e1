"""What a demo flow is: the demo's VMs and pools, a flow (what it injects, the reactions, the
forgeries) and its expectations, and the pools once the flows are over.

Pure data, shared by the checks, the flows of each phase, and the play that runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from functions.core.decide import NO_RESTORE_KINDS
from mbridge.demo.timeline import EventTimeline
from wire.model import Cloud, EventKind, EventSource, EventStatus, MaintenanceEvent

AVAILABILITY_SET = ("web-0", "web-1", "web-2")
SPOT_VM = "spot-0"
SCALE_SET_VM = "vmss-0"
AZURE_VMS = (*AVAILABILITY_SET, SPOT_VM, SCALE_SET_VM)
GCE_VM = "gce-0"

# What each load-balancer pool of the demo holds (a VM that is gone afterwards stays out).
POOLS: Mapping[str, tuple[str, ...]] = {
    "web": AVAILABILITY_SET,
    "spot": (SPOT_VM,),
    "scale-set": (SCALE_SET_VM,),
    "gce": (GCE_VM,),
}

# Documented seconds a Started Azure event lasts (the simulator keeps it at least 2 real s).
STARTED_FOR = 20


@dataclass(frozen=True)
class Context:
    """What the checks need to know about the run."""

    drain_period_seconds: float


# A check returns None when the expectation held, else what was seen instead.
Check = Callable[[EventTimeline, Context], Optional[str]]


@dataclass(frozen=True)
class Expectation:
    text: str
    check: Check


@dataclass(frozen=True)
class Reaction:
    """Once `stage` is seen (and `delay` real seconds passed), POST `body` to the simulator's `path`."""

    stage: str
    delay: float
    path: str
    body: Mapping[str, Any] = field(default_factory=dict)
    says: str = ""


@dataclass(frozen=True)
class Forgery:
    """A report a compromised VM (`by`) publishes with its own genuine proof: about `resources`,
    claiming to come from `claims`. At injection, or once `stage` of its flow is seen."""

    by: str
    claims: str
    status: EventStatus
    resources: tuple[str, ...]
    stage: str | None = None
    says: str = ""

    def event(self, event_id: str, kind: EventKind) -> MaintenanceEvent:
        return MaintenanceEvent(
            cloud=Cloud.AZURE,
            event_id=event_id,
            kind=kind,
            status=self.status,
            reporter=self.claims,
            sequence="1",
            resources=self.resources,
            not_before=None,
            duration_seconds=-1,
            event_source=EventSource.PLATFORM,
            description="forged by the demo: a compromised VM speaking for others",
            raw={"EventId": event_id},
        )


@dataclass(frozen=True)
class Flow:
    key: str
    title: str
    cloud: Cloud
    phase: int
    kind: EventKind
    vms: tuple[str, ...]  # the VMs the maintenance is for
    inject: tuple[str, Mapping[str, Any]] | None  # control API path and body (None: forgeries only)
    expectations: tuple[Expectation, ...]
    ends_with: tuple[str, ...]  # the stages after which nothing more is expected
    event_id: str | None = None  # Azure: fixed, so the demo can follow it; GCE: the agent derives it
    reactions: tuple[Reaction, ...] = ()
    forgeries: tuple[Forgery, ...] = ()
    # The VM whose agent is stopped before the injection: its maintenance is known from the control
    # plane only (a world that reads no central feed does not play the flow).
    agent_down: str | None = None


def pools_after(flows: Sequence[Flow]) -> dict[str, list[str]]:
    """The pools once the flows are over: as they were, but for VMs that are gone (Terminate, Preempt)."""
    gone = {vm for flow in flows if flow.kind in NO_RESTORE_KINDS for vm in flow.vms}
    return {name: sorted(set(vms) - gone) for name, vms in POOLS.items()}
