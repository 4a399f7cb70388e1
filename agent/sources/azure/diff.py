"""What changed between two Scheduled Events documents, as lifecycle events
(docs/contracts.md#event-lifecycle). Pure.

The state is plain data that `agent.state` persists together with the outbox rows, so a restart
resumes the diff where it stopped: an event that ends while the agent is down is still reported
when it comes back, as completed or canceled by how it was last seen.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from agent.sources.azure.document import (
    AzureEventStatus,
    AzureScheduledEvent,
    ScheduledEventsDocument,
    parse_event,
    to_maintenance_event,
)
from wire.model import EventStatus, MaintenanceEvent

# Azure: the events of the last document, keyed by lowercased EventId.
AzureState = dict[str, AzureScheduledEvent]


def diff_azure(
    previous: Mapping[str, AzureScheduledEvent],
    document: ScheduledEventsDocument,
    *,
    reporter: str,
    observed_at: datetime,
    approved: Collection[str] = frozenset(),
) -> tuple[AzureState, list[MaintenanceEvent]]:
    """Compare a Scheduled Events document with the previous one, by EventId.

    - new and Scheduled → scheduled; new and already Started (hardware failure) → started
    - Scheduled → Started → started
    - gone: see `ending`
    - NotBefore, Description or Duration changes → state only

    An entry whose EventStatus could not be read counts as not started yet: it is reported as
    scheduled, and its end is inferred like a Scheduled one's. `approved` holds the lowercased
    EventIds this agent approved. Disappearances come first: they free what a new event may need
    (e.g. a disruption budget).
    """
    sequence = str(document.incarnation)
    current = document.by_id()
    changes: list[MaintenanceEvent] = []
    for key, before in previous.items():
        if key not in current:
            ended = ending(before, observed_at, approved=key in approved)
            changes.append(to_maintenance_event(before, status=ended, reporter=reporter, sequence=sequence))
    for key, event in current.items():
        known = previous.get(key)
        if known is None:
            status = EventStatus.STARTED if event.status is AzureEventStatus.STARTED else EventStatus.SCHEDULED
        elif known.status is not AzureEventStatus.STARTED and event.status is AzureEventStatus.STARTED:
            status = EventStatus.STARTED
        else:
            continue
        changes.append(to_maintenance_event(event, status=status, reporter=reporter, sequence=sequence))
    return dict(current), changes


def ending(last_seen: AzureScheduledEvent, gone_at: datetime, *, approved: bool) -> EventStatus:
    """How an event ended, from how it was last seen, when it is found gone at `gone_at`.

    Azure never says: it removes an event when it is over, and removes a Scheduled one to cancel
    it. An event last seen Started ran. One last seen Scheduled ran too when its NotBefore has
    passed (Azure starts it then, whether or not anyone saw the Started step: the agent may have
    been stopped), when this agent approved it, or when its NotBefore is unknown — a wrong
    "completed" costs a VM kept out of its pool, a wrong "canceled" would put a deleted VM back.
    Only an event gone before its NotBefore, and not approved here, was canceled.
    """
    if last_seen.status is AzureEventStatus.STARTED or approved:
        return EventStatus.COMPLETED
    if last_seen.not_before is None or gone_at >= last_seen.not_before:
        return EventStatus.COMPLETED
    return EventStatus.CANCELED


# ---- state as JSON (what agent.state persists)


def azure_state_to_json(state: Mapping[str, AzureScheduledEvent]) -> dict[str, Any]:
    """Each event as IMDS printed it: restoring goes through the same parser as a live document."""
    return {key: event.raw for key, event in state.items()}


def azure_state_from_json(saved: Mapping[str, Any] | None) -> AzureState:
    return {key: parse_event(raw, f"saved state {key}") for key, raw in (saved or {}).items()}
