"""Phase 2, on the same VMs once phase 1 is over: a platform Reboot that drains two VMs of the
availability set (approved once, after the drain period of the last one out), a Redeploy Azure
cancels while it is Scheduled, and a GCE host maintenance that terminates the VM.
"""

from __future__ import annotations

from mbridge.demo.flows.checks import (
    approved_after_drain_period,
    approved_once,
    drained,
    drained_once_each,
    ended_as,
    never_approved,
    reached,
    restored,
)
from mbridge.demo.flows.injections import azure_event, gce_value
from mbridge.demo.flows.model import AVAILABILITY_SET, GCE_VM, Flow, Reaction
from wire.model import Cloud, EventKind

PLATFORM_REBOOT_ID = "3D6B2E85-1F9A-4C38-A742-8B0E5C2D1A55"
REDEPLOY_ID = "6F0A7C23-5B8D-4E19-8D36-1A4C9E7B2F66"

PHASE_2: tuple[Flow, ...] = (
    Flow(
        key="platform-reboot",
        title="platform Reboot of web-0, web-1",
        cloud=Cloud.AZURE,
        phase=2,
        kind=EventKind.REBOOT,
        vms=("web-0", "web-1"),
        event_id=PLATFORM_REBOOT_ID,
        # One approval starts the Reboot of both VMs (as Azure documents): it goes once both are out.
        inject=azure_event("Reboot", PLATFORM_REBOOT_ID, ("web-0", "web-1"), audience=list(AVAILABILITY_SET)),
        expectations=(
            drained("web-0", "web-1"),
            drained_once_each(),
            approved_after_drain_period(),
            approved_once(),
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
        inject=azure_event("Redeploy", REDEPLOY_ID, ("web-2",), audience=list(AVAILABILITY_SET)),
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
        inject=gce_value("TERMINATE_ON_HOST_MAINTENANCE"),
        reactions=(Reaction("drained", 1.0, *gce_value("NONE"), says="the VM is back: maintenance-event NONE"),),
        expectations=(drained(GCE_VM), ended_as("completed"), restored(GCE_VM)),
        ends_with=("restored",),
    ),
)
