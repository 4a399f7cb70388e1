"""The demo's maintenance flows: what each injects into the simulator, how the demo reacts
(cancel, end a GCE maintenance), and what the default policy promises for it.

Phase 1, 2 and 3 use the same VMs of the availability set, so they run one after the other;
the flows of a phase run at the same time. Phase 3 is an attack: a compromised VM publishes
reports it has no right to (`Forgery`), with its own genuine proof of identity. Every expectation
is checked against what really happened: the agents' envelopes on the bus, the functions' audit
log, and the simulator's log of approval POSTs (what reached IMDS).
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


def pools_after(flows: Sequence[Flow]) -> dict[str, list[str]]:
    """The pools once the flows are over: as they were, but for VMs that are gone (Terminate, Preempt)."""
    gone = {vm for flow in flows if flow.kind in NO_RESTORE_KINDS for vm in flow.vms}
    return {name: sorted(set(vms) - gone) for name, vms in POOLS.items()}


# ---- checks


def drained(*vms: str) -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return None if sorted(set(timeline.drained)) == sorted(vms) else f"drained {sorted(set(timeline.drained))}"

    return Expectation(f"drained {', '.join(vms)}", check)


def drained_once_each() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        repeats = sorted({vm for vm in timeline.drained if timeline.drained.count(vm) > 1})
        return f"drained more than once: {repeats}" if repeats else None

    return Expectation("each VM drained once", check)


def never_drained() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return f"drained {timeline.drained}" if timeline.drained else None

    return Expectation("never drained", check)


def restored(*vms: str) -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return None if sorted(timeline.restored) == sorted(vms) else f"restored {sorted(timeline.restored)}"

    return Expectation(f"restored {', '.join(vms)} once", check)


def never_restored() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return f"restored {timeline.restored}" if timeline.restored else None

    return Expectation("never restored (the VM is gone)", check)


def approved_once(by: tuple[str, ...] | None = None) -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        accepted = timeline.accepted_approvals()
        if len(accepted) != 1 or len(timeline.approve_commands) != 1:
            return f"{len(accepted)} approval POSTs accepted by IMDS, {len(timeline.approve_commands)} sent"
        posts = sorted({approval.vm for approval in timeline.approvals})
        if by is not None and posts != sorted(by):
            return f"approval POSTed by {posts}"
        return None

    who = f" by {', '.join(by)} only" if by else ""
    return Expectation(f"approved once{who}", check)


def approved_once_by_each(*vms: str) -> Expectation:
    """Each VM approved its own part once: a report moves only its own VM, and Azure starts an event
    of a shared host once every VM in it approved (the simulator's "approval": "all")."""

    def check(timeline: EventTimeline, _: Context) -> str | None:
        counted = [a.vm for a in timeline.approvals if a.outcome in ("accepted", "waiting-for-others")]
        targets = sorted(command.target for command in timeline.approve_commands)
        if sorted(counted) != sorted(vms) or targets != sorted(vms):
            return f"approvals counted by IMDS from {sorted(counted)}, commands sent to {targets}"
        return None

    return Expectation(f"approved once by each of {', '.join(vms)}", check)


def refused(*kinds: str) -> Expectation:
    """The functions refused the forgeries, and their audit log says why (one record each)."""

    def check(timeline: EventTimeline, _: Context) -> str | None:
        seen = sorted(kind for kind, _reason in timeline.refusals)
        if seen != sorted(kinds) or len(timeline.forged) != len(kinds):
            return f"refused {seen} of {len(timeline.forged)} forged report(s): {timeline.refusals}"
        return None

    return Expectation(f"forged reports refused ({', '.join(kinds)}), the audit log says why", check)


def approved_at_once() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        commands = timeline.approve_commands
        if not commands:
            return "no approval sent"
        return None if commands[0].execute_at is None else f"approval held until {commands[0].execute_at:%H:%M:%S}"

    return Expectation("approved at once", check)


def approved_after_drain_period() -> Expectation:
    def check(timeline: EventTimeline, context: Context) -> str | None:
        drain, approval = timeline.stages.get("drained"), timeline.stages.get("approved")
        if drain is None or approval is None:
            return f"drained at {drain}, approved at {approval}"
        waited = (approval - drain).total_seconds()
        # The agent POSTs on its next command-loop turn after execute_at: never before it.
        if waited < context.drain_period_seconds - 0.05:
            return f"approved {waited:.2f} s after the drain (drain period {context.drain_period_seconds:g} s)"
        return None

    return Expectation("approved after the drain period", check)


def never_approved() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        accepted = timeline.accepted_approvals()
        return f"IMDS accepted {len(accepted)} approval(s)" if accepted else None

    return Expectation("never approved", check)


def reached(stage: str) -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return None if stage in timeline.stages else f"never {stage}"

    return Expectation(stage, check)


def ended_as(status: str) -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return None if timeline.ended_as == status else f"ended as {timeline.ended_as or 'nothing yet'}"

    return Expectation(status, check)


def silent_after_start() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return f"ended as {timeline.ended_as}" if timeline.ended_as is not None else None

    # The VM is deleted once the event started; no other VM sees the event, so nobody reports its end.
    return Expectation("nothing reported after started (the VM is deleted)", check)


def restored_after_end() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        end, back = timeline.stages.get("completed"), timeline.stages.get("restored")
        if end is None or back is None:
            return f"ended at {end}, restored at {back}"
        return None if back >= end else "restored before the maintenance ended"

    return Expectation("restored only once the maintenance was over", check)


# ---- the flows


def _azure(event_type: str, event_id: str, resources: tuple[str, ...], **fields: Any) -> tuple[str, dict[str, Any]]:
    body = {"event_type": event_type, "event_id": event_id, "resources": list(resources), "started_for": STARTED_FOR}
    return "/_sim/events", {**body, **fields}


def _gce(value: str) -> tuple[str, dict[str, Any]]:
    return "/_sim/gce", {"vm": GCE_VM, "key": "maintenance-event", "value": value}


FREEZE_ID = "5E2F8A31-7C44-4B0D-9E15-2A6C8D901F11"
USER_REBOOT_ID = "9B1D4C77-0E3A-4F62-8A55-3C7E1B2D4F22"
SPOT_ID = "1C8E5A90-4D2B-4E77-B013-6F9A2C3D5E33"
SCALE_IN_ID = "7A3F9D12-8B6C-4A01-9C24-5E8B1D7F6A44"
PLATFORM_REBOOT_ID = "3D6B2E85-1F9A-4C38-A742-8B0E5C2D1A55"
REDEPLOY_ID = "6F0A7C23-5B8D-4E19-8D36-1A4C9E7B2F66"
FORGED_ID = "0BADF00D-6E21-4C5A-9B0D-7D3E2F1A9C77"
GENUINE_ID = "2C4E6A8B-3D5F-4A71-8E92-0B1C3D5E7F88"
COMPROMISED = "web-2"

FLOWS: tuple[Flow, ...] = (
    Flow(
        key="freeze",
        title="5 s Freeze on web-0, web-1",
        cloud=Cloud.AZURE,
        phase=1,
        kind=EventKind.FREEZE,
        vms=("web-0", "web-1"),
        event_id=FREEZE_ID,
        inject=_azure(
            "Freeze", FREEZE_ID, ("web-0", "web-1"), duration_seconds=5, audience=list(AVAILABILITY_SET), approval="all"
        ),
        expectations=(
            approved_once_by_each("web-0", "web-1"),
            never_drained(),
            reached("started"),
            ended_as("completed"),
        ),
        ends_with=("completed",),
    ),
    Flow(
        key="user-reboot",
        title="user-initiated Reboot of web-2",
        cloud=Cloud.AZURE,
        phase=1,
        kind=EventKind.REBOOT,
        vms=("web-2",),
        event_id=USER_REBOOT_ID,
        inject=_azure("Reboot", USER_REBOOT_ID, ("web-2",), event_source="User", audience=list(AVAILABILITY_SET)),
        expectations=(
            drained("web-2"),
            approved_at_once(),
            approved_once(),
            reached("started"),
            ended_as("completed"),
            restored("web-2"),
        ),
        ends_with=("restored",),
    ),
    Flow(
        key="spot-preempt",
        title="Spot eviction (Preempt) of spot-0",
        cloud=Cloud.AZURE,
        phase=1,
        kind=EventKind.PREEMPT,
        vms=(SPOT_VM,),
        event_id=SPOT_ID,
        inject=_azure("Preempt", SPOT_ID, (SPOT_VM,), audience=[SPOT_VM]),
        expectations=(drained(SPOT_VM), reached("started"), silent_after_start(), never_restored()),
        ends_with=("started",),
    ),
    Flow(
        key="scale-in",
        title="scale-set Terminate of vmss-0",
        cloud=Cloud.AZURE,
        phase=1,
        kind=EventKind.TERMINATE,
        vms=(SCALE_SET_VM,),
        event_id=SCALE_IN_ID,
        inject=_azure("Terminate", SCALE_IN_ID, (SCALE_SET_VM,), audience=[SCALE_SET_VM], description="Scale-in"),
        expectations=(
            drained(SCALE_SET_VM),
            approved_once(by=(SCALE_SET_VM,)),
            reached("started"),
            silent_after_start(),
            never_restored(),
        ),
        ends_with=("started",),
    ),
    Flow(
        key="gce-migration",
        title="GCE live migration of gce-0",
        cloud=Cloud.GCE,
        phase=1,
        kind=EventKind.LIVE_MIGRATE,
        vms=(GCE_VM,),
        inject=_gce("MIGRATE_ON_HOST_MAINTENANCE"),
        reactions=(Reaction("drained", 1.0, *_gce("NONE"), says="the migration is over: maintenance-event NONE"),),
        expectations=(drained(GCE_VM), ended_as("completed"), restored(GCE_VM), restored_after_end()),
        ends_with=("restored",),
    ),
    Flow(
        key="platform-reboot",
        title="platform Reboot of web-0, web-1",
        cloud=Cloud.AZURE,
        phase=2,
        kind=EventKind.REBOOT,
        vms=("web-0", "web-1"),
        event_id=PLATFORM_REBOOT_ID,
        inject=_azure(
            "Reboot", PLATFORM_REBOOT_ID, ("web-0", "web-1"), audience=list(AVAILABILITY_SET), approval="all"
        ),
        expectations=(
            drained("web-0", "web-1"),
            drained_once_each(),
            approved_after_drain_period(),
            approved_once_by_each("web-0", "web-1"),
            reached("started"),
            ended_as("completed"),
            restored("web-0", "web-1"),
        ),
        ends_with=("restored",),
    ),
    Flow(
        key="redeploy-canceled",
        title="Redeploy of web-2, canceled while Scheduled",
        cloud=Cloud.AZURE,
        phase=2,
        kind=EventKind.REDEPLOY,
        vms=("web-2",),
        event_id=REDEPLOY_ID,
        inject=_azure("Redeploy", REDEPLOY_ID, ("web-2",), audience=list(AVAILABILITY_SET)),
        reactions=(Reaction("drained", 0.0, f"/_sim/events/{REDEPLOY_ID}/cancel", says="Azure cancels the Redeploy"),),
        expectations=(drained("web-2"), ended_as("canceled"), restored("web-2"), never_approved()),
        ends_with=("restored",),
    ),
    Flow(
        key="gce-terminate",
        title="GCE host maintenance (terminate) of gce-0",
        cloud=Cloud.GCE,
        phase=2,
        kind=EventKind.HOST_TERMINATE,
        vms=(GCE_VM,),
        inject=_gce("TERMINATE_ON_HOST_MAINTENANCE"),
        reactions=(Reaction("drained", 1.0, *_gce("NONE"), says="the VM is back: maintenance-event NONE"),),
        expectations=(drained(GCE_VM), ended_as("completed"), restored(GCE_VM)),
        ends_with=("restored",),
    ),
    Flow(
        key="forged-reboot",
        title=f"a compromised {COMPROMISED} forges a Reboot of web-0, then reports one of web-0, web-1",
        cloud=Cloud.AZURE,
        phase=3,
        kind=EventKind.REBOOT,
        vms=("web-0",),
        event_id=FORGED_ID,
        inject=None,
        forgeries=(
            # claims to be web-0's agent: its proof names web-2 (unverified)
            Forgery(COMPROMISED, claims="web-0", status=EventStatus.SCHEDULED, resources=("web-0",)),
            # as itself, about other VMs (not-self)
            Forgery(COMPROMISED, claims=COMPROMISED, status=EventStatus.SCHEDULED, resources=("web-0", "web-1")),
        ),
        expectations=(refused("unverified", "not-self"), never_drained(), never_approved()),
        ends_with=("refused",),
    ),
    Flow(
        key="genuine-reboot",
        title=f"web-0's genuine Reboot, with a completion forged by {COMPROMISED} while it is drained",
        cloud=Cloud.AZURE,
        phase=3,
        kind=EventKind.REBOOT,
        vms=("web-0",),
        event_id=GENUINE_ID,
        inject=_azure("Reboot", GENUINE_ID, ("web-0",), audience=list(AVAILABILITY_SET)),
        forgeries=(
            Forgery(
                COMPROMISED,
                claims="web-0",
                status=EventStatus.COMPLETED,
                resources=("web-0",),
                stage="drained",
                says=f"{COMPROMISED} publishes web-0's completion to put it back early",
            ),
        ),
        expectations=(
            refused("unverified"),
            drained("web-0"),
            approved_after_drain_period(),
            approved_once(),
            ended_as("completed"),
            restored("web-0"),
            restored_after_end(),
        ),
        ends_with=("restored",),
    ),
)
