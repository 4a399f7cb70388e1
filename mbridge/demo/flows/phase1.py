"""Phase 1: one maintenance of each kind at once, on VMs that do not share one: a Freeze of two VMs
of the availability set (approved by both), a user-initiated Reboot, a Spot eviction, a scale-set
Terminate, and a GCE live migration.
"""

from __future__ import annotations

from mbridge.demo.flows.checks import (
    approved_at_once,
    approved_once,
    drained,
    ended_as,
    never_drained,
    never_restored,
    reached,
    restored,
    restored_after_end,
    silent_after_start,
)
from mbridge.demo.flows.injections import azure_event, gce_value
from mbridge.demo.flows.model import AVAILABILITY_SET, GCE_VM, SCALE_SET_VM, SPOT_VM, Flow, Reaction
from wire.model import Cloud, EventKind

FREEZE_ID = "5E2F8A31-7C44-4B0D-9E15-2A6C8D901F11"
USER_REBOOT_ID = "9B1D4C77-0E3A-4F62-8A55-3C7E1B2D4F22"
SPOT_ID = "1C8E5A90-4D2B-4E77-B013-6F9A2C3D5E33"
SCALE_IN_ID = "7A3F9D12-8B6C-4A01-9C24-5E8B1D7F6A44"

PHASE_1: tuple[Flow, ...] = (
    Flow(
        key="freeze",
        title="5 s Freeze on web-0, web-1",
        cloud=Cloud.AZURE,
        phase=1,
        kind=EventKind.FREEZE,
        vms=("web-0", "web-1"),
        event_id=FREEZE_ID,
        inject=azure_event(
            "Freeze", FREEZE_ID, ("web-0", "web-1"), duration_seconds=5, audience=list(AVAILABILITY_SET)
        ),
        expectations=(
            approved_once(),
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
        inject=azure_event("Reboot", USER_REBOOT_ID, ("web-2",), event_source="User", audience=list(AVAILABILITY_SET)),
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
        inject=azure_event("Preempt", SPOT_ID, (SPOT_VM,), audience=[SPOT_VM]),
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
        inject=azure_event("Terminate", SCALE_IN_ID, (SCALE_SET_VM,), audience=[SCALE_SET_VM], description="Scale-in"),
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
        inject=gce_value("MIGRATE_ON_HOST_MAINTENANCE"),
        reactions=(Reaction("drained", 1.0, *gce_value("NONE"), says="the migration is over: maintenance-event NONE"),),
        expectations=(drained(GCE_VM), ended_as("completed"), restored(GCE_VM), restored_after_end()),
        ends_with=("restored",),
    ),
)
