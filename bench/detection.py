"""Detection latency: from the simulator applying a change to the agent's envelope on the bus.

- Azure, polling every 1 s (`--poll-interval 1`, the default): p99 ≤ poll interval + 50 ms.
- GCE, long-polling maintenance-event: p99 ≤ 50 ms.

Start: the simulator's log entry for the change (`unix_time`, written while the change is still
invisible to clients). End: `published_at` of the envelope on the embedded local bus (transport
`local`), stamped by the bus as it takes the row. Both are the system clock of this machine.

The agent runs as a child process (`mbridge agent`), as on a VM: its threads do not compete with
the simulator's for this interpreter's lock, which would add latency that a VM does not have. The
simulator runs in this process, so the benchmark reads its log directly. How changes are made and
spaced is in bench/agent_detection.py.
"""

from __future__ import annotations

from bench.agent_detection import AZURE_GAP, AZURE_POLL_INTERVAL, GCE_GAP, azure_run, gce_run
from bench.context import BenchContext
from bench.results import Figure, at_most, latency_figures

AZURE_P99_TARGET_MS = AZURE_POLL_INTERVAL * 1000 + 50
GCE_P99_TARGET_MS = 50.0


def run(context: BenchContext) -> list[Figure]:
    azure = azure_run(context)
    azure_note = "; ".join(
        [
            f"{azure.changes} changes (Reboot added, Started, removed) {AZURE_GAP[0]:g}-{AZURE_GAP[1]:g} s apart "
            f"at random, poll interval {AZURE_POLL_INTERVAL:g} s, transport local; "
            "simulator change → envelope on the bus",
            *azure.notes,
        ]
    )
    figures = latency_figures(
        "detection.azure", azure.agent.latencies_ms, p99_target=at_most(AZURE_P99_TARGET_MS), note=azure_note
    )
    gce = gce_run(context)
    gce_note = (
        f"{gce.changes} changes of maintenance-event (NONE ↔ MIGRATE_ON_HOST_MAINTENANCE) "
        f"{GCE_GAP[0]:g}-{GCE_GAP[1]:g} s apart at random, long-poll, transport local; "
        "simulator change → envelope on the bus"
    )
    if gce.agent.missed:
        gce_note += f"; the agent published nothing for {gce.agent.missed} change(s)"
    figures += latency_figures(
        "detection.gce", gce.agent.latencies_ms, p99_target=at_most(GCE_P99_TARGET_MS), note=gce_note
    )
    return figures
