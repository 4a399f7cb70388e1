"""Phase 4, a dead agent: web-2's agent is stopped, then Azure schedules a Reboot of web-2. No report
comes from the VM; the control plane's (Event Grid, from the simulator's central feed) does. The
functions find web-2's agent silent, drain web-2 on the control plane's word (the demo's policy:
`silent_agents: drain`), never approve it (Azure starts it at its NotBefore), and put web-2 back
when the control plane reports it completed. Played only where the world reads a central feed.
"""

from __future__ import annotations

from mbridge.demo.flows.checks import drained, ended_as, found_silent, never_approved, restored
from mbridge.demo.flows.injections import azure_event
from mbridge.demo.flows.model import Flow
from wire.model import Cloud, EventKind

DEAD_AGENT_ID = "7E1D3C5B-9A2F-4B68-8C04-5F6A7B8C9D10"
DEAD_VM = "web-2"
NOTICE = 60  # documented seconds until Azure starts the Reboot on its own

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
)
