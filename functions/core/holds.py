"""How long an event may hold its slots of a disruption budget, and when it is drained past the budget
(docs/policy.md#disruption-budget).

A reservation ends when its event ends. But an event's end is a report, and a report may never come:
a compromised VM can self-report a Scheduled event of its own VM that never completes, and would keep
its pool's only slot for ever while another VM's genuine Reboot waits undrained. So every reservation
also carries an expiry, fixed when it is admitted from what the report says and the clouds' documented
figures, never from how long the report claims to last:

    expires_at = start + LONGEST_RUN + HOLD_MARGIN
    start      = NotBefore, but no earlier than the admission and no later than the admission plus
                 the cloud's longest notice; the admission itself for an event without NotBefore
                 (Azure gives "" once an event started) or one that started already

And a waiting event is drained past the budget when the platform starts it regardless: once it
started, or once its NotBefore is nearer than the drain period and the approval's margin.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from functions.core.policy import Policy
from wire.model import Cloud, EventStatus, MaintenanceEvent
from wire.timefmt import format_rfc3339

# The longest notice each cloud documents between an event's announcement and its start. Azure
# (Scheduled Events, "Event scheduling"): Freeze and Reboot 15 minutes, Redeploy 10, Terminate 5 to 15
# (the scale set's notBeforeTimeout), Preempt 30 seconds. GCE (instance/maintenance-event): 60 seconds
# before a live migration, 60 minutes before a host terminate (GPU, bare metal).
LONGEST_NOTICE = {Cloud.AZURE: timedelta(minutes=15), Cloud.GCE: timedelta(minutes=60)}
# How long an event runs once it starts. Azure documents "Started to Completed (event removed from
# Events array): 10 minutes" (simulator/store/azure_events.py STARTED_FOR); a started Terminate or
# Preempt lets go of its slot at once (the VM is deleted). GCE documents no duration for a live
# migration or a host maintenance: the same 10 minutes are used.
LONGEST_RUN = timedelta(minutes=10)
# For the report of the end to reach the functions: an agent polls every few seconds, a bus
# delivers within seconds, a retried invocation within minutes.
HOLD_MARGIN = timedelta(minutes=5)
# The longest any reservation holds; a reservation an earlier version wrote (without an expiry)
# holds this long from when this version first finds it (functions/core/store_rules.py).
LONGEST_HOLD = max(LONGEST_NOTICE.values()) + LONGEST_RUN + HOLD_MARGIN


def reservation_expiry(event: MaintenanceEvent, admitted_at: datetime) -> datetime:
    """When the event's reservation stops counting if no report ended it before."""
    start = admitted_at
    if event.not_before is not None and event.status is EventStatus.SCHEDULED:
        # A claimed NotBefore a year away must not hold a slot for a year.
        start = min(max(event.not_before, admitted_at), admitted_at + LONGEST_NOTICE[event.cloud])
    return start + LONGEST_RUN + HOLD_MARGIN


def past_the_budget(event: MaintenanceEvent, policy: Policy, now: datetime) -> str | None:
    """Why the event is drained even though its pool's budget has no room (the platform starts it
    whatever the budget says, and a drain then still beats none), or None while it may wait."""
    if event.status is EventStatus.STARTED:
        return "the event started"
    if event.not_before is None:
        return None
    lead = timedelta(seconds=policy.drain_period_seconds + policy.not_before_margin_seconds)
    if now < event.not_before - lead:
        return None
    return (
        f"NotBefore at {format_rfc3339(event.not_before)} is within the {policy.drain_period_seconds:g} s drain "
        f"period and {policy.not_before_margin_seconds:g} s margin"
    )
