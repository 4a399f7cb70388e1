"""The Azure events shared by every VM of one simulator, and each VM's DocumentIncarnation.

It moves events through their lifecycle (Scheduled, Started, removed) on the timeline, counts
approvals (one VM's, or every tenant's), plans the departure of the VMs an eviction deletes, and
tells the central feed of every state change (central_feed.py), as Azure's Event Grid topic is told.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from simulator.clock import Clock, rfc3339
from simulator.store.approvals import ApprovalRecord, ApprovalResult, most_consequential
from simulator.store.azure_events import (
    APPROVAL_START_DELAY,
    DEFAULT_DESCRIPTION,
    DEFAULT_NOTICE,
    DELETES_ITS_VMS,
    MIN_STARTED_REAL_SECONDS,
    STARTED_FOR,
    ApprovalRule,
    EventSpec,
    EventStatus,
    SimEvent,
)
from simulator.store.central_feed import CentralFeed, FeedStatus, feed_status
from simulator.store.log import SimLog
from simulator.store.requests import FieldError, RequestError
from simulator.store.timeline import Timeline

if TYPE_CHECKING:
    from simulator.departures import Departures


class EventStore:
    """Azure events shared by every VM of one simulator, with one DocumentIncarnation per VM."""

    def __init__(
        self,
        clock: Clock,
        cond: threading.Condition,
        timeline: Timeline,
        log: SimLog,
        vm_names: Sequence[str],
        departures: Departures,
        feed: CentralFeed | None = None,
    ) -> None:
        self._clock = clock
        self._cond = cond
        self._timeline = timeline
        self._log = log
        self._vm_names = tuple(vm_names)
        self._departures = departures
        self._feed = feed  # None: nothing publishes the changes centrally (the fleet benchmark's stores)
        self._events: dict[str, SimEvent] = {}  # key: lowercased EventId, in insertion order
        self._incarnation = dict.fromkeys(self._vm_names, 1)
        self._seen: dict[str, tuple[object, ...]] = dict.fromkeys(self._vm_names, ())
        self._approvals: list[ApprovalRecord] = []

    # ---- reading

    def document(self, vm: str) -> tuple[int, list[SimEvent]]:
        """This VM's DocumentIncarnation and the events it sees, in the order they were added."""
        with self._cond:
            return self._incarnation[vm], self._visible(vm)

    def events(self) -> list[SimEvent]:
        with self._cond:
            return list(self._events.values())

    def incarnations(self) -> dict[str, int]:
        with self._cond:
            return dict(self._incarnation)

    def find(self, event_id: str) -> SimEvent:
        with self._cond:
            event = self._events.get(event_id.lower())
        if event is None:
            raise RequestError(404, f"no event with EventId {event_id!r}; GET /_sim/state lists them")
        return event

    def approvals(self) -> list[ApprovalRecord]:
        with self._cond:
            return list(self._approvals)

    # ---- changing

    def add(
        self,
        spec: EventSpec,
        resources: tuple[str, ...],
        audience: tuple[str, ...],
        at: float | None = None,
    ) -> SimEvent:
        """Add an event (names already resolved); Scheduled events get their notice, Started ones not.

        `at` is the documented time the change belongs to (a scenario step's time); default now.
        """
        unknown = [name for name in audience if name not in self._vm_names]
        if unknown:
            raise FieldError("audience", f"{unknown[0]!r} is not a VM of this simulator: {self._vm_names}")
        with self._cond:
            now = self._clock.sim_now() if at is None else at
            event_id = spec.event_id or str(uuid.uuid4()).upper()
            if event_id.lower() in self._events:
                raise RequestError(409, f"an event with EventId {event_id!r} already exists")
            started_for = STARTED_FOR if spec.started_for is None else spec.started_for
            event = SimEvent(
                event_id=event_id,
                event_type=spec.event_type,
                status=EventStatus.SCHEDULED,
                resources=resources,
                description=DEFAULT_DESCRIPTION[spec.event_type] if spec.description is None else spec.description,
                event_source=spec.event_source,
                duration_seconds=spec.duration_seconds,
                audience=audience,
                approval=spec.approval,
                keep_serving=spec.keep_serving,
                started_for=started_for,
                added_at=now,
                due_at=now,
                not_before_at=None,
                not_before_epoch=None,
            )
            if spec.status is EventStatus.STARTED:
                # Hardware failure: Azure skips Scheduled and shows the event already Started.
                event = self._started(event, now)
                self._events[event_id.lower()] = event
                self._log.add(
                    f"event {event_id} added already Started: {event.event_type.value} on "
                    f"{', '.join(resources)} (no notice)",
                    at=now,
                )
                self._delete_vms_of(event)
            else:
                notice = DEFAULT_NOTICE[spec.event_type] if spec.notice is None else spec.notice
                event = replace(
                    event,
                    due_at=now + notice,
                    not_before_at=now + notice,
                    not_before_epoch=self._clock.wall_at(now + notice),
                )
                self._events[event_id.lower()] = event
                self._log.add(
                    f"event {event_id} added: {event.event_type.value} Scheduled on {', '.join(resources)}, "
                    f"NotBefore {event.not_before} (in {notice:g} documented s)",
                    at=now,
                )
            self._schedule_next(event)
            self._publish(event, feed_status(event.status), now)
            self._refresh()
            return event

    def approve(self, vm: str, event_ids: Sequence[str], source: str, at: float | None = None) -> ApprovalResult:
        """Apply a well-formed StartRequests POST from `vm`.

        IMDS answers 200 to every well-formed POST, so an EventId this VM cannot see is ignored
        without an error; only the approval log tells it apart (outcome `unknown-event`).
        """
        with self._cond:
            now = self._clock.sim_now() if at is None else at
            visible = {e.event_id.lower() for e in self._visible(vm)}
            unknown = [i for i in event_ids if i.lower() not in visible]
            outcomes = [self._approve_one(vm, i, now) for i in event_ids if i.lower() in visible]
            ignored = f"ignored unknown EventId {', '.join(map(repr, unknown))}" if unknown else ""
            result = ApprovalResult(200, most_consequential(outcomes), ignored)
            self.record_approval(vm, event_ids, result, source, at=now)
            return result

    def _approve_one(self, vm: str, event_id: str, now: float) -> str:
        event = self._events[event_id.lower()]
        if event.status is EventStatus.STARTED:
            return "already-started"
        if event.approved_at is not None:
            return "already-approved"
        if event.approval is ApprovalRule.ALL:
            return self._approve_as_tenant(event, vm, now)
        self._start_soon(event, vm, now)
        return "accepted"

    def _approve_as_tenant(self, event: SimEvent, vm: str, now: float) -> str:
        # "If the VM is on shared infrastructure, the system will then wait for all other tenants
        # on the same hardware to also approve the job or timeout": the tenants are its Resources.
        if vm not in event.resources:
            return "not-in-resources"
        if vm in event.approvals_from:
            return "already-approved"
        event = replace(event, approvals_from=(*event.approvals_from, vm))
        self._events[event.event_id.lower()] = event
        waiting = [name for name in event.resources if name not in event.approvals_from]
        if waiting:
            self._log.add(f"event {event.event_id}: approval counted, waiting for {', '.join(waiting)}", vm=vm, at=now)
            return "waiting-for-others"
        self._start_soon(event, vm, now)
        return "accepted"

    def _start_soon(self, event: SimEvent, vm: str, now: float) -> None:
        start_at = min(event.due_at, now + APPROVAL_START_DELAY)
        approvals_from = event.approvals_from if vm in event.approvals_from else (*event.approvals_from, vm)
        event = replace(event, approvals_from=approvals_from, approved_at=now, approved_by=vm, due_at=start_at)
        self._events[event.event_id.lower()] = event
        self._schedule_next(event)

    def record_approval(
        self,
        vm: str,
        event_ids: Sequence[str],
        result: ApprovalResult,
        source: str,
        at: float | None = None,
    ) -> None:
        """Append one POST attempt (also refused ones) to the approval log."""
        with self._cond:
            now = self._clock.sim_now() if at is None else at
            self._approvals.append(
                ApprovalRecord(
                    time=rfc3339(self._clock.wall_now()),
                    sim_time=round(now, 3),
                    vm=vm,
                    event_ids=list(event_ids),
                    status=result.status or None,
                    outcome=result.outcome,
                    source=source,
                )
            )
        detail = f" ({result.message})" if result.message else ""
        ids = ", ".join(event_ids) if event_ids else "-"
        self._log.add(f"approval {ids}: {result.status or 'no response'} {result.outcome}{detail}", vm=vm, at=now)

    def advance_event(self, event_id: str, at: float | None = None) -> tuple[str, SimEvent | None]:
        """Move an event one step now: Scheduled -> Started, Started -> removed (completed)."""
        with self._cond:
            event = self.find(event_id)
            self._transition(event.event_id, self._clock.sim_now() if at is None else at)
            after = self._events.get(event.event_id.lower())
            return ("started" if after is not None else "completed"), after

    def cancel(self, event_id: str, at: float | None = None) -> SimEvent:
        """Azure cancels a Scheduled event by removing it; a Started event cannot be canceled."""
        with self._cond:
            event = self.find(event_id)
            if event.status is EventStatus.STARTED:
                raise RequestError(
                    409,
                    f"event {event.event_id} is already Started and cannot be canceled; "
                    f"use POST /_sim/events/{event.event_id}/advance to complete it",
                )
            now = self._clock.sim_now() if at is None else at
            del self._events[event.event_id.lower()]
            self._timeline.cancel(_timeline_key(event))
            self._log.add(f"event {event.event_id} canceled (removed while Scheduled)", at=now)
            self._publish(event, FeedStatus.CANCELED, now)
            self._refresh()
            return event

    def clock_advanced(self) -> None:
        """The real moment of every pending start moved closer: recompute the NotBefore shown."""
        with self._cond:
            for key, event in list(self._events.items()):
                if event.not_before_at is not None:
                    self._events[key] = replace(event, not_before_epoch=self._clock.wall_at(event.not_before_at))
            self._refresh()

    # ---- internals

    def _visible(self, vm: str) -> list[SimEvent]:
        return [e for e in self._events.values() if vm in e.audience]

    def _started(self, event: SimEvent, at: float) -> SimEvent:
        # Never shorter than MIN_STARTED_REAL_SECONDS of real time at the current speed.
        stay = max(event.started_for, MIN_STARTED_REAL_SECONDS * self._clock.speed)
        return replace(
            event,
            status=EventStatus.STARTED,
            started_at=at,
            due_at=at + stay,
            not_before_at=None,
            not_before_epoch=None,
        )

    def _transition(self, event_id: str, at: float) -> None:
        event = self._events.get(event_id.lower())
        if event is None:
            return
        if event.status is EventStatus.SCHEDULED:
            event = self._started(event, at)
            self._events[event_id.lower()] = event
            why = f"approved by {event.approved_by}" if event.approved_by else "NotBefore reached"
            self._log.add(f"event {event.event_id} Started ({why})", at=at)
            self._delete_vms_of(event)
            self._schedule_next(event)
            self._publish(event, FeedStatus.STARTED, at)
        else:
            del self._events[event_id.lower()]
            self._timeline.cancel(_timeline_key(event))  # when completed early through the control API
            self._log.add(f"event {event.event_id} removed (completed)", at=at)
            # Azure removes a Started event from IMDS once it is over; the central feed says Completed.
            self._publish(event, FeedStatus.COMPLETED, at)
        self._refresh()

    def _delete_vms_of(self, event: SimEvent) -> None:
        # Planned before the event's removal, so on a tie the deleted VMs are gone before it shows.
        if event.event_type not in DELETES_ITS_VMS or event.keep_serving:
            return
        assert event.started_at is not None
        for vm in event.resources:
            self._departures.leave_after(
                vm, event.started_at, 0.0, f"deleted by {event.event_type.value} {event.event_id}"
            )

    def _publish(self, event: SimEvent, status: FeedStatus, at: float) -> None:
        if self._feed is not None:
            self._feed.record(event, status, at)

    def _schedule_next(self, event: SimEvent) -> None:
        what = "start" if event.status is EventStatus.SCHEDULED else "complete"
        self._timeline.schedule(
            _timeline_key(event),
            event.due_at,
            f"{what} event {event.event_id}",
            functools.partial(self._transition, event.event_id),
        )

    def _refresh(self) -> None:
        # DocumentIncarnation: +1 for a VM exactly when what that VM can see changed.
        for vm in self._vm_names:
            seen = tuple(e.signature() for e in self._visible(vm))
            if seen != self._seen[vm]:
                self._seen[vm] = seen
                self._incarnation[vm] += 1
        self._cond.notify_all()


def _timeline_key(event: SimEvent) -> str:
    return f"event:{event.event_id.lower()}"
