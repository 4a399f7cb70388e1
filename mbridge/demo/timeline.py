"""What happened to each demo event, stage by stage, and when.

Three witnesses, none of them the demo's own bookkeeping:
- the agents' envelopes on the bus: `detected` (the envelope's time, taken by the agent when it
  saw the change), `published` (when the bus took it), `started`, `completed`/`canceled`;
- the functions' audit log: `decided`, `drained` (per VM), the approval sent, `restored`;
- the simulator's approval log: `approved` is when IMDS accepted a StartRequests POST.
Elapsed times count from the moment the demo injected the maintenance into the simulator.

An envelope whose proof does not name the VM it claims to come from (a forgery the demo makes
to show the functions refusing it) marks no stage: it is noted as `forged`, and the functions'
audit records of what they refused (`unverified`, `not-self`) as `refused`.

Each stage is also kept per VM (`vm_stages`): an event of two VMs is drained, approved and
restored once for each, and the report draws one row per VM.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Optional

from functions.core.central import SENDER_PREFIX as CENTRAL_SENDER
from functions.core.ports import AuditRecord
from wire.envelope import decode
from wire.errors import MalformedEnvelopeError
from wire.model import Cloud, EventKind, EventStatus, MaintenanceEvent
from wire.timefmt import parse_rfc3339

STAGES = ("detected", "published", "decided", "drained", "approved", "started", "completed", "restored")
# Every stage a live line names (mbridge.demo.report.LiveLines.stage): the summary's, and those only
# told as they happen. The live lines pad a stage to the longest of these.
LIVE_STAGES = (
    "injected",
    *STAGES,
    "approval sent",
    "reported centrally",
    "silent",
    "refused",
    "forged",
    "deleted",
)


@dataclass(frozen=True)
class ImdsApproval:
    """One StartRequests POST as the simulator logged it."""

    vm: str
    outcome: str  # accepted | already-approved | unknown-event | ...
    time: datetime


@dataclass(frozen=True)
class Refusal:
    """A report the functions would not act on, as their audit log says: `kind` unverified | not-self,
    `vm` the VM the record names (the report's claimed reporter, or its sender)."""

    kind: str
    reason: str
    vm: str
    time: datetime


@dataclass(frozen=True)
class SentApproval:
    target: str
    execute_at: datetime | None


@dataclass
class EventTimeline:
    """One flow's event. `matches` says whether an envelope's event is this one."""

    key: str
    cloud: Cloud
    kind: EventKind
    event_id: str | None  # Azure: known up front; GCE: learnt from the first envelope
    injected_at: datetime | None = None
    stages: dict[str, datetime] = field(default_factory=dict)
    ended_as: str | None = None
    reporters: set[str] = field(default_factory=set)
    drained: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    approvals: list[ImdsApproval] = field(default_factory=list)
    approve_commands: list[SentApproval] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    command_results: list[tuple[str, str, str]] = field(default_factory=list)  # vm, result, reason
    forged: list[str] = field(default_factory=list)  # "<status> claimed by <vm>, proven by <vm>"
    silent: list[str] = field(default_factory=list)  # VMs whose agent the functions found silent
    ended_centrally: str | None = None  # how the control plane said it ended (`ended_as`: the agents)
    # The earliest any witness saw the end (the first sighting may be a later one: an agent polls,
    # the control plane's feed comes at once), for what must come after it.
    ended_at: datetime | None = None

    def saw_end(self, when: datetime) -> None:
        self.ended_at = when if self.ended_at is None else min(self.ended_at, when)

    refusals: list[Refusal] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)  # VMs the event deleted (the simulator's log says when)
    vm_stages: dict[str, dict[str, datetime]] = field(default_factory=dict)  # VM -> its own first sightings

    def matches(self, event: MaintenanceEvent) -> bool:
        if event.cloud is not self.cloud:
            return False
        if self.event_id is not None:
            return event.event_id.lower() == self.event_id.lower()
        # A GCE flow takes the first event of its kind after its injection.
        return self.injected_at is not None and event.kind is self.kind

    def owns(self, event_id: str) -> bool:
        return self.event_id is not None and event_id.lower() == self.event_id.lower()

    def accepted_approvals(self) -> list[ImdsApproval]:
        return [approval for approval in self.approvals if approval.outcome == "accepted"]

    def elapsed_ms(self, stage: str) -> float | None:
        return self.ms_since_injection(self.stages.get(stage))

    def vm_elapsed_ms(self, vm: str, stage: str) -> float | None:
        """When `vm`'s own part of the event reached `stage` (its report, its drain, its approval)."""
        return self.ms_since_injection(self.vm_stages.get(vm, {}).get(stage))

    def ms_since_injection(self, at: datetime | None) -> float | None:
        if at is None or self.injected_at is None:
            return None
        # The witnesses' times are written with millisecond precision, rounded down (RFC 3339 text:
        # envelopes, audit records, the simulator's approval log), while the injection is read off
        # the clock with microseconds: a change seen 0.4 ms after its injection would read as -0.6 ms.
        # Counting from the injection's own millisecond compares like with like.
        injected = self.injected_at - timedelta(microseconds=self.injected_at.microsecond % 1000)
        # A stage cannot come before the injection that caused it; a witness with a clock of its
        # own can still put it there: the simulator stamps approvals with its launch wall time plus
        # monotonic time, which drifts from the system clock as NTP slews it. Such a reading is
        # shown as 0 ms rather than as a negative duration.
        return max(0.0, (at - injected).total_seconds() * 1000.0)


# Called with (timeline, stage, detail, when) the first time a stage is seen (and for every sighting
# of the stages seen again: each VM's drain, each refusal); `when` is the witness's time.
StageListener = Callable[[EventTimeline, str, str, datetime], None]
# The VM a message's proof names, or None when it has no valid proof (the demo's own check).
SenderOf = Callable[[bytes], Optional[str]]
REFUSED = ("unverified", "not-self")
# The simulator's outcomes of a StartRequests POST that count as that VM's approval taken.
OWN_PART_APPROVED = ("accepted", "waiting-for-others")


class Observer:
    """Feeds the witnesses' records into the timelines; each stage is marked once, at its first sighting."""

    def __init__(
        self, timelines: Sequence[EventTimeline], on_stage: StageListener, sender_of: SenderOf | None = None
    ) -> None:
        self.timelines = list(timelines)
        self._on_stage = on_stage
        self._sender_of = sender_of

    def envelope(self, body: bytes, published_at: datetime) -> None:
        try:
            envelope = decode(body)
        except MalformedEnvelopeError:
            return  # the functions audit it; it belongs to no flow
        event = envelope.data
        if not isinstance(event, MaintenanceEvent):
            return  # a command result: seen through the audit log
        timeline = next((t for t in self.timelines if t.matches(event)), None)
        if timeline is None:
            return
        if self._sender_of is not None:
            sender = self._sender_of(body)
            if sender != event.reporter or event.reporter not in event.resources:
                claim = f"{event.status.value} of {', '.join(event.resources)} by {event.reporter}"
                timeline.forged.append(f"{claim}, proven by {sender or 'nobody'}")
                self._mark(
                    timeline, "forged", published_at, f"{claim}; its proof names {sender or 'nobody'}", again=True
                )
                return
        if timeline.event_id is None:
            timeline.event_id = event.event_id
        timeline.reporters.add(event.reporter)
        # A VM's own report marks its row; a VM reporting an event of others only the event's stages.
        own = event.reporter if event.reporter in event.resources else None
        if event.status in (EventStatus.SCHEDULED, EventStatus.STARTED):
            self._mark(timeline, "detected", envelope.time, f"{event.status.value}, by {event.reporter}", vm=own)
            self._mark(timeline, "published", published_at, f"envelope {envelope.id[:12]}", vm=own)
        if event.status is EventStatus.STARTED:
            self._mark(timeline, "started", envelope.time, f"seen by {event.reporter}", vm=own)
        elif event.status in (EventStatus.COMPLETED, EventStatus.CANCELED):
            if timeline.ended_as is None:
                timeline.ended_as = event.status.value
            timeline.saw_end(envelope.time)
            self._mark(timeline, "completed", envelope.time, f"{event.status.value}, seen by {event.reporter}", vm=own)

    def audit(self, record: AuditRecord) -> None:
        timeline = next((t for t in self.timelines if t.owns(record.event_id)), None) or self._adopting(record)
        if timeline is None:
            return
        if record.kind in REFUSED:
            timeline.refusals.append(Refusal(record.kind, record.reason, record.vm, record.time))
            self._mark(timeline, "refused", record.time, record.reason, again=True)
        elif record.kind == "agent-silent":
            timeline.silent.append(record.vm)
            self._mark(timeline, "silent", record.time, record.reason, again=True, vm=record.vm)
        elif record.kind == "event" and str(record.detail.get("sender", "")).startswith(CENTRAL_SENDER):
            # The control plane's report: a dead agent's event is seen, and ends, only there.
            self._mark(timeline, "reported centrally", record.time, f"{record.status}: {record.detail['sender']}")
            if record.status in (EventStatus.COMPLETED.value, EventStatus.CANCELED.value):
                timeline.ended_centrally = timeline.ended_centrally or record.status
                timeline.saw_end(record.time)
                self._mark(timeline, "completed", record.time, f"{record.status}, by the control plane")
        elif record.kind == "decision":
            timeline.rules.append(record.rule)
            self._mark(timeline, "decided", record.time, f"rule {record.rule}: {record.reason}", vm=record.vm)
        elif record.kind == "command-result":
            timeline.command_results.append((record.vm, record.action, record.reason))
        elif record.kind == "action" and record.action == "drain":
            timeline.drained.append(record.vm)
            self._mark(timeline, "drained", record.time, record.vm, again=True, vm=record.vm)
        elif record.kind == "action" and record.action == "approve":
            timeline.approve_commands.append(SentApproval(record.vm, record.at))
            self._on_stage(timeline, "approval sent", f"to {record.vm}, {_when_sent(timeline, record)}", record.time)
        elif record.kind == "action" and record.action == "restore":
            timeline.restored.append(record.vm)
            self._mark(timeline, "restored", record.time, record.vm, again=True, vm=record.vm)

    def _adopting(self, record: AuditRecord) -> EventTimeline | None:
        """The GCE flow a control-plane report is the first sighting of (its agent is down: no envelope
        gave the flow its derived id), which takes the report's event id from now on."""
        if record.kind != "event" or not str(record.detail.get("sender", "")).startswith(CENTRAL_SENDER):
            return None
        for timeline in self.timelines:
            if (
                timeline.event_id is None
                and timeline.injected_at is not None
                and timeline.cloud.value == record.detail.get("cloud")
                and timeline.kind.value == record.detail.get("kind")
            ):
                timeline.event_id = record.event_id
                return timeline
        return None

    def approval(self, entry: Mapping[str, Any]) -> None:
        ids = [str(event_id) for event_id in entry.get("event_ids") or []]
        for timeline in self.timelines:
            if any(timeline.owns(event_id) for event_id in ids):
                when = parse_rfc3339(str(entry["time"]))
                approval = ImdsApproval(str(entry["vm"]), str(entry["outcome"]), when)
                timeline.approvals.append(approval)
                if approval.outcome in OWN_PART_APPROVED:
                    # IMDS took this VM's approval; an event of a shared host starts once all of them did.
                    timeline.vm_stages.setdefault(approval.vm, {}).setdefault("approved", when)
                if approval.outcome == "accepted":
                    self._mark(timeline, "approved", when, f"IMDS accepted the POST of {approval.vm}")

    def departure(self, vm: str, event_id: str, when: datetime) -> None:
        """VM `vm` stopped answering at `when`, deleted by event `event_id` (a Spot eviction, a scale-in)."""
        timeline = next((t for t in self.timelines if t.owns(event_id)), None)
        if timeline is None:
            return
        timeline.deleted.append(vm)
        self._mark(
            timeline, "deleted", when, f"{vm} is gone: its metadata service stopped answering", again=True, vm=vm
        )

    def _mark(
        self,
        timeline: EventTimeline,
        stage: str,
        when: datetime,
        detail: str,
        again: bool = False,
        vm: str | None = None,
    ) -> None:
        if vm is not None:
            timeline.vm_stages.setdefault(vm, {}).setdefault(stage, when)
        if stage not in timeline.stages:
            timeline.stages[stage] = when
            self._on_stage(timeline, stage, detail, when)
        elif again:
            self._on_stage(timeline, stage, detail, when)


# How the simulator's log says a VM left because an event deleted it (docs/simulator.md).
_DELETED = re.compile(r"^stopped answering: deleted by \w+ (?P<event_id>\S+)$")


def departure_of(entry: Mapping[str, Any]) -> tuple[str, str, datetime] | None:
    """(VM, event id, when) of a simulator log entry saying an event deleted a VM; None for any other."""
    found = _DELETED.match(str(entry.get("message", "")))
    if found is None or not entry.get("vm"):
        return None
    return str(entry["vm"]), found["event_id"], parse_rfc3339(str(entry["time"]))


def _when_sent(timeline: EventTimeline, record: AuditRecord) -> str:
    """When the approval will be POSTed, from the command itself (`execute_at`), counted from the
    VM's drain: the decision's reason, printed with `decided`, says why; this says what was sent."""
    if record.at is None:
        return "at once"
    posted = f"{record.at:%H:%M:%S.%f}"[:-3]
    drained = timeline.vm_stages.get(record.vm, {}).get("drained") or timeline.stages.get("drained")
    if drained is None:
        return f"to be POSTed at {posted}"
    return f"to be POSTed at {posted}, {(record.at - drained).total_seconds():.1f} s after the drain"
