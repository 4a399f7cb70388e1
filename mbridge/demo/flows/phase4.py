"""Phase 4, dead agents, one on each cloud; each agent is stopped before its VM's maintenance, and
started again once the flow is over (its operator was told it was silent).

- Azure schedules a Reboot of web-2. No report comes from the VM; the control plane's (Event Grid,
  from the simulator's central feed) does. The functions find web-2's agent silent, drain web-2 on
  the control plane's word (the demo's policy: `silent_agents: drain`), never approve it (Azure
  starts it at its NotBefore), and put web-2 back when the control plane reports it completed.
- GCE schedules a maintenance window on gce-0; the control plane's report is its system-event log
  entry (through a log sink). gce-0's agent is found silent (an advance notice: audited only); when
  the window opens, gce-0 is drained for the window (no one will read the host event's 60-second
  notice), and put back when the log says the window completed.

A world plays the flow of a cloud only if its functions read that cloud's central feed.
"""

from __future__ import annotations

from mbridge.demo.flows.checks import drained, ended_as, found_silent, never_approved, restored
from mbridge.demo.flows.injections import azure_event, gce_upcoming
from mbridge.demo.flows.model import GCE_VM, Flow, Reaction
from wire.model import Cloud, EventKind

DEAD_AGENT_ID = "7E1D3C5B-9A2F-4B68-8C04-5F6A7B8C9D10"
DEAD_VM = "web-2"
NOTICE = 60  # documented seconds until Azure starts the Reboot on its own
WINDOW_IN, WINDOW_LENGTH = 3600, 4 * 3600  # documented seconds: GCE's window, an hour ahead, for four hours

PHASE_4: tuple[Flow, ...] = (
    Flow(
        key="dead-agent",
        title=f"Reboot of {DEAD_VM}, whose agent is down: handled from the control plane",
        cloud=Cloud.AZURE,
        phase=4,
        kind=EventKind.REBOOT,
        vms=(DEAD_VM,),
        event_id=DEAD_AGENT_ID,
        inject=azure_event("Reboot", DEAD_AGENT_ID, (DEAD_VM,), audience=[DEAD_VM], notice=NOTICE),
        expectations=(
            found_silent(DEAD_VM),
            drained(DEAD_VM),
            never_approved(),
            ended_as("completed"),
            restored(DEAD_VM),
        ),
        ends_with=("restored",),
        agent_down=DEAD_VM,
    ),
    Flow(
        key="gce-dead-agent",
        title=f"maintenance window of {GCE_VM}, whose agent is down: handled from the control plane",
        cloud=Cloud.GCE,
        phase=4,
        kind=EventKind.UPCOMING,
        vms=(GCE_VM,),
        inject=gce_upcoming({"window_start_in": WINDOW_IN, "window_length": WINDOW_LENGTH}),
        reactions=(
            Reaction(
                "silent",
                0.5,
                *gce_upcoming({"maintenanceStatus": "ONGOING"}),
                says="the window opens: upcoming-maintenance ONGOING",
            ),
            Reaction("drained", 1.0, *gce_upcoming(None), says="the window is over: upcoming-maintenance removed"),
        ),
        expectations=(
            found_silent(GCE_VM),
            drained(GCE_VM),
            never_approved(),
            ended_as("completed"),
            restored(GCE_VM),
        ),
        ends_with=("restored",),
        agent_down=GCE_VM,
    ),
)
