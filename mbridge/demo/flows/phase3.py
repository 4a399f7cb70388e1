"""Phase 3, the attack: a compromised VM publishes reports it has no right to (`Forgery`), with its
own genuine proof of identity: a Reboot of another VM, one of several VMs, and the early completion
of another VM's genuine Reboot. Each forgery must be refused and change nothing.
"""

from __future__ import annotations

from mbridge.demo.flows.checks import (
    approved_after_drain_period,
    approved_once,
    drained,
    ended_as,
    never_approved,
    never_drained,
    refused,
    restored,
    restored_after_end,
)
from mbridge.demo.flows.injections import azure_event
from mbridge.demo.flows.model import AVAILABILITY_SET, Flow, Forgery
from wire.model import Cloud, EventKind, EventStatus

FORGED_ID = "0BADF00D-6E21-4C5A-9B0D-7D3E2F1A9C77"
GENUINE_ID = "2C4E6A8B-3D5F-4A71-8E92-0B1C3D5E7F88"
COMPROMISED = "web-2"

PHASE_3: tuple[Flow, ...] = (
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
        inject=azure_event("Reboot", GENUINE_ID, ("web-0",), audience=list(AVAILABILITY_SET)),
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
