"""The demo's maintenance flows: what each injects into the simulator, how the demo reacts
(cancel, end a GCE maintenance), and what the default policy promises for it.

Phase 1, 2, 3 and 4 use the same VMs of the availability set, so they run one after the other;
the flows of a phase run at the same time. Phase 3 is an attack: a compromised VM publishes
reports it has no right to (`Forgery`), with its own genuine proof of identity. Phase 4 is a dead
agent: a VM's maintenance known from the control plane only. Every expectation
is checked against what really happened: the agents' envelopes on the bus, the functions' audit
log, and the simulator's log of approval POSTs (what reached IMDS).

The modules: model (flows, VMs, pools), checks (the expectations), injections, and the flows of
each phase (phase1, phase2, phase3). `FLOWS` is every flow in phase order; the names the demo, the
benchmarks and the tests use are exported here.
"""

from __future__ import annotations

from mbridge.demo.flows.checks import (
    approved_after_drain_period,
    approved_at_once,
    approved_once,
    drained,
    drained_once_each,
    ended_as,
    found_silent,
    never_approved,
    never_drained,
    never_restored,
    reached,
    refused,
    restored,
    restored_after_end,
    silent_after_start,
)
from mbridge.demo.flows.model import (
    AVAILABILITY_SET,
    AZURE_VMS,
    GCE_VM,
    POOLS,
    SCALE_SET_VM,
    SPOT_VM,
    STARTED_FOR,
    Check,
    Context,
    Expectation,
    Flow,
    Forgery,
    Reaction,
    pools_after,
)
from mbridge.demo.flows.phase1 import FREEZE_ID, PHASE_1, SCALE_IN_ID, SPOT_ID, USER_REBOOT_ID
from mbridge.demo.flows.phase2 import PHASE_2, PLATFORM_REBOOT_ID, REDEPLOY_ID
from mbridge.demo.flows.phase3 import COMPROMISED, FORGED_ID, GENUINE_ID, PHASE_3
from mbridge.demo.flows.phase4 import DEAD_AGENT_ID, DEAD_VM, PHASE_4

FLOWS: tuple[Flow, ...] = (*PHASE_1, *PHASE_2, *PHASE_3, *PHASE_4)

__all__ = [
    "AVAILABILITY_SET",
    "AZURE_VMS",
    "COMPROMISED",
    "DEAD_AGENT_ID",
    "DEAD_VM",
    "FLOWS",
    "FORGED_ID",
    "FREEZE_ID",
    "GCE_VM",
    "GENUINE_ID",
    "PLATFORM_REBOOT_ID",
    "POOLS",
    "REDEPLOY_ID",
    "SCALE_IN_ID",
    "SCALE_SET_VM",
    "SPOT_ID",
    "SPOT_VM",
    "STARTED_FOR",
    "USER_REBOOT_ID",
    "Check",
    "Context",
    "Expectation",
    "Flow",
    "Forgery",
    "Reaction",
    "approved_after_drain_period",
    "approved_at_once",
    "approved_once",
    "drained",
    "drained_once_each",
    "ended_as",
    "found_silent",
    "never_approved",
    "never_drained",
    "never_restored",
    "pools_after",
    "reached",
    "refused",
    "restored",
    "restored_after_end",
    "silent_after_start",
]
