"""Shared simulator state: the Azure event store, the timeline that moves it, and the logs.

One `threading.Condition` (over an RLock) guards all of it. Every HTTP handler thread, the timeline
thread and GCE long-polls use that same condition, so any change wakes whoever waits for one; the
simulator holds little state and its critical sections are short, so one lock is simpler than many.
"""

from __future__ import annotations

import functools
import heapq
import logging
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Callable, TypedDict, TypeVar

from simulator.clock import Clock, rfc1123, rfc3339

if TYPE_CHECKING:
    from simulator.departures import Departures

LOGGER = logging.getLogger("simulator")


# --------------------------------------------------------------------------- errors and wire types


class Cloud(str, Enum):
    AZURE = "azure"
    GCE = "gce"


class RequestError(Exception):
    """A request the simulator refuses; `status` is the HTTP status the control API answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class FieldError(RequestError):
    """One field of a control-API body or scenario step is wrong; the message names the field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(400, f"field '{field_name}': {message}")
        self.field = field_name
        self.reason = message


@dataclass(frozen=True)
class MetadataRequest:
    """One HTTP request as the API modules see it; header names are lowercased."""

    method: str
    path: str
    query: Mapping[str, str]  # first value of each parameter
    headers: Mapping[str, str]
    body: bytes
    vm: str

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(frozen=True)
class Response:
    """What a handler answers; the HTTP layer writes it.

    `broken` is this answer's malformed variant (what the `malformed` fault sends instead); only
    document-carrying 200 answers have one, and the API module that knows the format makes it.
    """

    status: int
    body: bytes = b""
    content_type: str = "application/json; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    broken: bytes | None = None


# --------------------------------------------------------------------------- logs


class LogEntry(TypedDict):
    time: str
    sim_time: float
    unix_time: float  # the system clock when the change took effect, to the microsecond
    vm: str | None
    message: str


class SimLog:
    """What happened, in order: served as GET /_sim/log and written to the `simulator` logger."""

    def __init__(self, clock: Clock, cond: threading.Condition) -> None:
        self._clock = clock
        self._cond = cond
        self._entries: list[LogEntry] = []

    def add(self, message: str, vm: str | None = None, at: float | None = None) -> None:
        sim_time = self._clock.sim_now() if at is None else at
        # Changes are logged from inside their critical section: no client sees one before its unix_time.
        entry = LogEntry(
            time=rfc3339(self._clock.wall_now()),
            sim_time=round(sim_time, 3),
            unix_time=round(self._clock.system_now(), 6),
            vm=vm,
            message=message,
        )
        with self._cond:
            self._entries.append(entry)
        where = f" {vm}:" if vm else ""
        LOGGER.info("[sim %9.1fs]%s %s", sim_time, where, message)

    def entries(self) -> list[LogEntry]:
        with self._cond:
            return list(self._entries)


# --------------------------------------------------------------------------- timeline


@dataclass(frozen=True, order=True)
class _Entry:
    at: float
    seq: int
    key: str = field(compare=False)
    label: str = field(compare=False)
    action: Callable[[float], None] = field(compare=False)


class Timeline:
    """Future state changes keyed by name, run in (time, scheduling order) order.

    An action receives its own due time, not the time it actually runs, so a clock advance that
    jumps over several entries replays them exactly as if time had passed: a start due at 960 s
    schedules its completion at 960 + 600 s even when the advance lands at 2000 s.
    """

    def __init__(self, clock: Clock, cond: threading.Condition) -> None:
        self._clock = clock
        self._cond = cond
        self._heap: list[_Entry] = []
        self._live: dict[str, _Entry] = {}
        self._seq = 0
        self._stopped = False

    def schedule(self, key: str, at: float, label: str, action: Callable[[float], None]) -> None:
        """Run `action(at)` once the clock reaches `at`; replaces any entry with the same key."""
        with self._cond:
            self._seq += 1
            entry = _Entry(at=at, seq=self._seq, key=key, label=label, action=action)
            self._live[key] = entry
            heapq.heappush(self._heap, entry)
            self._cond.notify_all()

    def cancel(self, key: str) -> None:
        with self._cond:
            self._live.pop(key, None)
            self._cond.notify_all()

    def next_due(self) -> float | None:
        with self._cond:
            self._drop_stale()
            return self._heap[0].at if self._heap else None

    def pending(self) -> list[dict[str, object]]:
        with self._cond:
            ordered = sorted(self._live.values())
            return [{"at": round(e.at, 3), "key": e.key, "what": e.label} for e in ordered]

    def run_due(self) -> int:
        """Run every entry due by now (including entries that due entries schedule); count them."""
        ran = 0
        with self._cond:
            while True:
                self._drop_stale()
                if not self._heap or self._heap[0].at > self._clock.sim_now():
                    break
                entry = heapq.heappop(self._heap)
                del self._live[entry.key]
                try:
                    entry.action(entry.at)
                except Exception:
                    # One broken entry must not stop the timeline thread (and with it every later event).
                    LOGGER.exception("timeline entry %r failed", entry.label)
                ran += 1
            if ran:
                self._cond.notify_all()
        return ran

    def run_forever(self) -> None:
        """The timeline thread: sleep on the condition until the next entry is due or anything changes."""
        with self._cond:
            while not self._stopped:
                self.run_due()
                due = self.next_due()
                timeout = None if due is None else self._clock.real_delay(due - self._clock.sim_now())
                # Any schedule(), clock advance or stop() notifies, so a far-off wait never goes stale.
                self._cond.wait(timeout)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _drop_stale(self) -> None:
        # Replaced or cancelled entries stay in the heap until they surface; skip them here.
        while self._heap and self._live.get(self._heap[0].key) is not self._heap[0]:
            heapq.heappop(self._heap)


# --------------------------------------------------------------------------- Azure event model


class EventType(str, Enum):
    FREEZE = "Freeze"
    REBOOT = "Reboot"
    REDEPLOY = "Redeploy"
    PREEMPT = "Preempt"
    TERMINATE = "Terminate"


class EventStatus(str, Enum):
    SCHEDULED = "Scheduled"
    STARTED = "Started"


class EventSource(str, Enum):
    PLATFORM = "Platform"
    USER = "User"


class ApprovalRule(str, Enum):
    """Whose approval starts a Scheduled event before its NotBefore."""

    ANY = "any"  # one approval from any VM that sees it (a VM alone on its host)
    ALL = "all"  # every VM in Resources: tenants of one host node, which Azure waits for


# Minimum notice by type (documented seconds), from the Scheduled Events "Event scheduling" table.
# Terminate is the scale set's notBeforeTimeout, 5 to 15 minutes; 10 minutes is the docs' own example.
DEFAULT_NOTICE: Mapping[EventType, float] = {
    EventType.FREEZE: 900.0,
    EventType.REBOOT: 900.0,
    EventType.REDEPLOY: 600.0,
    EventType.TERMINATE: 600.0,
    EventType.PREEMPT: 30.0,
}
STARTED_FOR = 600.0  # "Started to Completed (event removed from Events array): 10 minutes"
APPROVAL_START_DELAY = 3.0  # an approval starts the event "within a few seconds"
MIN_STARTED_REAL_SECONDS = 2.0  # so a 1 s poller still sees Started at high --speed
# "Preempt: The Spot Virtual Machine is being deleted"; "Terminate: The virtual machine is scheduled
# to be deleted": once Started, the VMs in Resources are gone (departures.py).
DELETES_ITS_VMS = frozenset({EventType.PREEMPT, EventType.TERMINATE})

DEFAULT_DESCRIPTION: Mapping[EventType, str] = {
    EventType.FREEZE: "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
    EventType.REBOOT: "Virtual machine is going to be restarted because of host maintenance.",
    EventType.REDEPLOY: "Virtual machine is going to be redeployed to another host.",
    EventType.PREEMPT: "Spot virtual machine is being evicted.",
    EventType.TERMINATE: "Virtual machine is going to be deleted.",
}


@dataclass(frozen=True)
class EventSpec:
    """A request to add an event (POST /_sim/events body or a scenario `add` step), validated.

    Names in `resources` and `audience` may still be "$N" references; the caller resolves them.
    """

    event_type: EventType
    resources: tuple[str, ...] | None = None
    event_id: str | None = None
    status: EventStatus = EventStatus.SCHEDULED
    notice: float | None = None
    started_for: float | None = None
    event_source: EventSource = EventSource.PLATFORM
    duration_seconds: int = -1
    description: str | None = None
    audience: tuple[str, ...] | None = None
    approval: ApprovalRule = ApprovalRule.ANY
    keep_serving: bool = False  # the VMs a Preempt/Terminate deletes go on answering


@dataclass(frozen=True)
class SimEvent:
    """One Azure scheduled event as the store holds it; times are documented seconds."""

    event_id: str
    event_type: EventType
    status: EventStatus
    resources: tuple[str, ...]
    description: str
    event_source: EventSource
    duration_seconds: int
    audience: tuple[str, ...]
    started_for: float
    added_at: float
    due_at: float  # the next automatic transition: start (Scheduled) or removal (Started)
    not_before_at: float | None  # when NotBefore is reached (documented s); None once Started
    not_before_epoch: float | None  # that moment in real wall-clock time, as shown to clients
    approval: ApprovalRule = ApprovalRule.ANY
    keep_serving: bool = False
    approvals_from: tuple[str, ...] = ()  # the VMs whose approval counted, in order
    approved_at: float | None = None  # when the approval that starts it arrived
    approved_by: str | None = None
    started_at: float | None = None

    @property
    def not_before(self) -> str:
        if self.status is EventStatus.STARTED or self.not_before_epoch is None:
            return ""
        return rfc1123(self.not_before_epoch)

    def signature(self) -> tuple[object, ...]:
        """Everything a client can see; a change here is a new DocumentIncarnation."""
        return (
            self.event_id,
            self.status,
            self.event_type,
            self.resources,
            self.not_before,
            self.description,
            self.event_source,
            self.duration_seconds,
        )


def parse_event_spec(body: Mapping[str, object]) -> EventSpec:
    """Validate a POST /_sim/events body (also a scenario `add` step)."""
    allowed = {
        "event_type",
        "resources",
        "event_id",
        "status",
        "notice",
        "started_for",
        "event_source",
        "duration_seconds",
        "description",
        "audience",
        "approval",
        "keep_serving",
    }
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise FieldError(unknown[0], f"unknown field; allowed: {', '.join(sorted(allowed))}")
    event_type = _enum_field(body, "event_type", EventType, required=True)
    assert event_type is not None
    status = _enum_field(body, "status", EventStatus) or EventStatus.SCHEDULED
    source = _enum_field(body, "event_source", EventSource) or EventSource.PLATFORM
    event_id = body.get("event_id")
    if event_id is not None and (not isinstance(event_id, str) or not event_id.strip()):
        raise FieldError("event_id", "must be a non-empty string (Azure uses GUIDs)")
    description = body.get("description")
    if description is not None and not isinstance(description, str):
        raise FieldError("description", "must be a string")
    duration = body.get("duration_seconds", -1)
    if isinstance(duration, bool) or not isinstance(duration, int) or duration < -1:
        raise FieldError("duration_seconds", "must be an integer >= -1 (-1 means unknown)")
    return EventSpec(
        event_type=event_type,
        resources=_names_field(body, "resources"),
        event_id=event_id,
        status=status,
        notice=_seconds_field(body, "notice"),
        started_for=_seconds_field(body, "started_for"),
        event_source=source,
        duration_seconds=duration,
        description=description,
        audience=_names_field(body, "audience"),
        approval=_enum_field(body, "approval", ApprovalRule) or ApprovalRule.ANY,
        keep_serving=bool_field(body, "keep_serving"),
    )


_E = TypeVar("_E", bound=Enum)


def _enum_field(body: Mapping[str, object], name: str, kind: type[_E], required: bool = False) -> _E | None:
    value = body.get(name)
    choices = ", ".join(str(m.value) for m in kind)
    if value is None:
        if required:
            raise FieldError(name, f"is required; one of {choices}")
        return None
    for member in kind:
        if isinstance(value, str) and value.lower() == str(member.value).lower():
            return member
    raise FieldError(name, f"must be one of {choices}, got {value!r}")


def bool_field(body: Mapping[str, object], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise FieldError(name, "must be true or false")
    return value


def _names_field(body: Mapping[str, object], name: str) -> tuple[str, ...] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise FieldError(name, "must be a list of VM names (strings; '$0' means the first VM)")
    return tuple(str(v) for v in value)


def _seconds_field(body: Mapping[str, object], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise FieldError(name, "must be a number of documented seconds >= 0")
    return float(value)


# --------------------------------------------------------------------------- approvals


class ApprovalRecord(TypedDict):
    time: str
    sim_time: float
    vm: str
    event_ids: list[str]
    status: int | None
    outcome: str
    source: str


@dataclass(frozen=True)
class ApprovalResult:
    status: int
    outcome: str
    message: str = ""


# --------------------------------------------------------------------------- the store


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
    ) -> None:
        self._clock = clock
        self._cond = cond
        self._timeline = timeline
        self._log = log
        self._vm_names = tuple(vm_names)
        self._departures = departures
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
            result = ApprovalResult(200, _most_consequential(outcomes), ignored)
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
            del self._events[event.event_id.lower()]
            self._timeline.cancel(_timeline_key(event))
            self._log.add(f"event {event.event_id} canceled (removed while Scheduled)", at=at)
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
        else:
            del self._events[event_id.lower()]
            self._timeline.cancel(_timeline_key(event))  # when completed early through the control API
            self._log.add(f"event {event.event_id} removed (completed)", at=at)
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


# One outcome per POST: the most consequential one among its EventIds.
_OUTCOMES_BY_CONSEQUENCE = ("accepted", "waiting-for-others", "already-approved", "already-started", "not-in-resources")


def _most_consequential(outcomes: Sequence[str]) -> str:
    return next((o for o in _OUTCOMES_BY_CONSEQUENCE if o in outcomes), "unknown-event")


def _timeline_key(event: SimEvent) -> str:
    return f"event:{event.event_id.lower()}"
