"""What changed in the GCE maintenance keys, as lifecycle events (docs/contracts.md#event-lifecycle).
Pure.

Each call applies one new value of one key to the previous state. The state is plain data that
`agent.state` persists together with the outbox rows, so a restart resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from agent.sources.gce.values import (
    MaintenanceValue,
    UpcomingMaintenance,
    maintenance_event,
    parse_maintenance_event,
    parse_preempted,
    parse_upcoming_maintenance,
    preempted_event,
    upcoming_event,
)
from wire.gce_ids import MAINTENANCE_EVENT_KEY, PREEMPTED_KEY, UPCOMING_MAINTENANCE_KEY
from wire.model import EventStatus, MaintenanceEvent
from wire.timefmt import format_rfc3339, parse_rfc3339


@dataclass(frozen=True)
class GceKeyState:
    """The last value of one GCE key (None: absent/404) and, while an event is active,
    when it was first observed: that moment anchors the event id until it ends."""

    value: str | None = None
    first_observed: datetime | None = None


GceState = dict[str, GceKeyState]

GCE_KEYS = (MAINTENANCE_EVENT_KEY, UPCOMING_MAINTENANCE_KEY, PREEMPTED_KEY)


@dataclass(frozen=True)
class GceIdentity:
    instance_id: str
    reporter: str


def diff_gce(
    previous: Mapping[str, GceKeyState],
    *,
    key: str,
    value: str | None,
    sequence: str,
    observed_at: datetime,
    identity: GceIdentity,
) -> tuple[GceState, list[MaintenanceEvent]]:
    """Apply one new value of one key (None = absent, 404).

    Raises:
        MalformedDocumentError: the value cannot be parsed; the caller keeps `previous`.
    """
    before = previous.get(key, GceKeyState())
    if key == MAINTENANCE_EVENT_KEY:
        after, changes = _maintenance_event(before, value, sequence, observed_at, identity)
    elif key == UPCOMING_MAINTENANCE_KEY:
        after, changes = _upcoming(before, value, sequence, observed_at, identity)
    elif key == PREEMPTED_KEY:
        after, changes = _preempted(before, value, sequence, observed_at, identity)
    else:
        raise ValueError(f"not a watched GCE key: {key!r}")
    state = dict(previous)
    state[key] = after
    return state, changes


def _maintenance_event(
    before: GceKeyState, value: str | None, sequence: str, observed_at: datetime, who: GceIdentity
) -> tuple[GceKeyState, list[MaintenanceEvent]]:
    # An absent key is no maintenance: some machine types never populate it. A value GCE added
    # after this release is a maintenance all the same (kind unknown), from it until NONE.
    none = MaintenanceValue.NONE.value
    new = parse_maintenance_event(value) if value is not None else none
    old = parse_maintenance_event(before.value) if before.value is not None else none
    if new == old:
        return replace(before, value=new), []
    changes: list[MaintenanceEvent] = []
    if old != none and before.first_observed is not None:
        # There is no "started" signal on GCE: the value going away is the completion.
        changes.append(_maintenance(old, EventStatus.COMPLETED, before.first_observed, sequence, who))
    if new == none:
        return GceKeyState(value=new), changes
    changes.append(_maintenance(new, EventStatus.SCHEDULED, observed_at, sequence, who))
    return GceKeyState(value=new, first_observed=observed_at), changes


def _maintenance(
    value: str, status: EventStatus, first_observed: datetime, sequence: str, who: GceIdentity
) -> MaintenanceEvent:
    return maintenance_event(
        value=value,
        status=status,
        instance_id=who.instance_id,
        reporter=who.reporter,
        first_observed=first_observed,
        sequence=sequence,
    )


def _upcoming(
    before: GceKeyState, value: str | None, sequence: str, observed_at: datetime, who: GceIdentity
) -> tuple[GceKeyState, list[MaintenanceEvent]]:
    new = parse_upcoming_maintenance(value) if value is not None else None
    old = parse_upcoming_maintenance(before.value) if before.value is not None else None
    old_first = before.first_observed or observed_at
    # The notice continues when the new value has the id the old one had (same window).
    same = (
        old is not None
        and new is not None
        and _notice(old, EventStatus.SCHEDULED, old_first, sequence, who).event_id
        == _notice(new, EventStatus.SCHEDULED, old_first, sequence, who).event_id
    )
    changes: list[MaintenanceEvent] = []
    if old is not None and not same:
        # Gone: the maintenance happened (or the notice was withdrawn). Another window is a
        # rescheduled notice: the old one ends as canceled and the new one starts fresh.
        ended = EventStatus.COMPLETED if new is None else EventStatus.CANCELED
        changes.append(_notice(old, ended, old_first, sequence, who))
    if new is None:
        return GceKeyState(), changes
    first = old_first if same else observed_at
    if not same:
        status = EventStatus.STARTED if new.ongoing else EventStatus.SCHEDULED
        changes.append(_notice(new, status, first, sequence, who))
    elif new.ongoing and old is not None and not old.ongoing:
        changes.append(_notice(new, EventStatus.STARTED, first, sequence, who))
    return GceKeyState(value=value, first_observed=first), changes


def _notice(
    upcoming: UpcomingMaintenance, status: EventStatus, first_observed: datetime, sequence: str, who: GceIdentity
) -> MaintenanceEvent:
    return upcoming_event(
        upcoming=upcoming,
        status=status,
        instance_id=who.instance_id,
        reporter=who.reporter,
        first_observed=first_observed,
        sequence=sequence,
    )


def _preempted(
    before: GceKeyState, value: str | None, sequence: str, observed_at: datetime, who: GceIdentity
) -> tuple[GceKeyState, list[MaintenanceEvent]]:
    now_preempted = parse_preempted(value) if value is not None else False
    was_preempted = parse_preempted(before.value) if before.value is not None else False
    text = "TRUE" if now_preempted else "FALSE"
    if now_preempted and not was_preempted:
        event = preempted_event(
            instance_id=who.instance_id, reporter=who.reporter, first_observed=observed_at, sequence=sequence
        )
        return GceKeyState(value=text, first_observed=observed_at), [event]
    if not now_preempted:
        return GceKeyState(value=text), []
    return before, []


# ---- state as JSON (what agent.state persists)


def gce_state_to_json(state: Mapping[str, GceKeyState]) -> dict[str, Any]:
    return {
        key: {
            "value": entry.value,
            "first_observed": format_rfc3339(entry.first_observed) if entry.first_observed else None,
        }
        for key, entry in state.items()
    }


def gce_state_from_json(saved: Mapping[str, Any] | None) -> GceState:
    return {
        key: GceKeyState(
            value=entry.get("value"),
            first_observed=parse_rfc3339(entry["first_observed"]) if entry.get("first_observed") else None,
        )
        for key, entry in (saved or {}).items()
    }
