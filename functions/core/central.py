"""Maintenance the control plane reports, beside the agents' reports (docs/architecture.md#two-paths).

Each cloud also publishes maintenance outside the VM, where no VM can forge it: Azure Scheduled
Events through Event Grid and Resource Graph, GCE `upcomingMaintenance` on the instance and its
system-event audit logs. An adapter turns what its feed delivers into `CentralReport`s, checked to
be of VMs in the deployment's scope; this module acts on them:

- **One event, two paths.** A report from the centre carries the event's own id, so its step has
  the envelope id the agent's report of the same step has (docs/contracts.md#deterministic-ids),
  and the end it records is the one both see (`lifecycle.mark_ended`: the first end wins). Each
  feed's report of a step is processed once per VM (claim `central|<feed>`): the centre's
  duplicates (Event Grid sends some twice; Resource Graph is read again on every pass) do nothing.
- **The centre closes what an agent could not.** A `completed` or `canceled` from the centre ends
  the VM's part as the agent's would: what this system drained is put back, the slots freed.
- **A silent agent is found.** A `scheduled` or `started` from the centre is watched (a line of its
  own, `WATCH_LINE`, in the store's parking): `sweep_silent`, run by a timer, audits an event whose
  VM's agent has not reported it `silent_agent_seconds` after the centre did as `agent-silent`
  (logged with `alert=agent-silent`, notified), and with policy `silent_agents: drain` takes the VM
  out of its pools on the centre's word. Never an approval from there: that is the agent's (Azure
  would start the event for every VM it names, docs/security.md).
- **One trace per event and VM.** A report from the centre is a span of the trace the event's
  records of that VM already have (`event_trace`): the agent's report's when the agent reported it
  first, else that of the centre's first report of it; none yet, it starts one. The agent's trace
  wins: a centre's report after the agent's joins it, while an agent's report after the centre's
  keeps the trace its envelope carries (the agent started it, and its commands carry it), so the
  centre's records before it stay in the centre's trace. A report matched by time has an id of its
  own and finds none. Its commands (a drain through /readyz) carry no trace: the centre's word is
  not the agent's, which may be too old to read one.
- **Telemetry.** Each delivery of a feed, or pass over a polled one, is one invocation of operation
  `central` (its entry point opens it with `invocation.reporting` and hands the report to
  `process_central`; a notice it cannot act on is refused as `NOTICE_REFUSED`), each sweep one of
  operation `sweep` (functions/core/telemetry.py).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from functions.core.invocation import (
    CLAIM_LEASE,
    Deps,
    Invocation,
    Outcome,
    event_record,
    report_detail,
    reporting,
    tell,
)
from functions.core.keys import claim_key, subject_key
from functions.core.lifecycle import ENDING, act, recall_end
from functions.core.log_fields import event_fields
from functions.core.ports import ActionName, AuditKind, AuditLog, AuditRecord, Claim, Result
from functions.core.process import ClaimBusyError
from functions.core.telemetry import SWEEP, InvocationReport
from wire.envelope import Envelope, envelope_for_event
from wire.errors import PermanentError
from wire.model import Cloud, EventKind, EventSource, EventStatus, MaintenanceEvent
from wire.timefmt import format_rfc3339, parse_rfc3339
from wire.tracecontext import TraceContext, is_trace_id, new_trace

LOGGER = logging.getLogger("mbridge.functions.central")

# The feeds, as the audit log names them.
EVENT_GRID, RESOURCE_GRAPH, GCE_UPCOMING, GCE_SYSTEM_EVENT = (
    "event-grid",
    "resource-graph",
    "gce-upcoming",
    "gce-system-event",
)
CENTRAL_SOURCES = (EVENT_GRID, RESOURCE_GRAPH, GCE_UPCOMING, GCE_SYSTEM_EVENT)
# The parking line of the VMs' parts the centre reported and no agent yet (pool names starting with
# '~' are refused in a policy, so no pool's line is this one).
WATCH_LINE = "~central"
SENDER_PREFIX = "control plane: "
WATCH_RULE = "central"
SILENT_RULE = "agent-silent"
# Watched parts one sweep looks at, at most: a sweep runs once a minute and each part costs the
# store about three requests (docs/scale.md, "The control plane's path").
SWEEP_MOST = 1000
# A report matched by time (`CentralReport.matched_by_time`) is the agent's notice of the same kind for
# the VM first seen this close to it: GCE's metadata value shows at most minutes before the log entry.
MATCH_WINDOW = timedelta(minutes=10)
# The refusal telemetry counts for a notice of a feed not acted on (`CentralRefused`).
NOTICE_REFUSED = "notice-refused"


class CentralRefused(PermanentError):
    """A control-plane notice that is not ours to act on (a VM outside the deployment's scope), or that
    cannot be read; the reason says which, naming the field or the setting."""


@dataclass(frozen=True)
class CentralReport:
    """One step of one event as a feed of the control plane reported it, for the VMs it names.

    `vms` are the VMs' names in the deployment's scope (the adapter checked each one's full identity,
    kept in `identities` for the audit log); `notice_id` is the feed's own id of this notice (an
    Event Grid event id, a LogEntry insertId), for the audit log.
    """

    cloud: Cloud
    event_id: str
    kind: EventKind
    status: EventStatus
    vms: tuple[str, ...]
    source: str
    notice_id: str = ""
    not_before: datetime | None = None
    duration_seconds: int | None = None
    event_source: EventSource | None = None
    description: str = ""
    identities: tuple[tuple[str, str], ...] = field(default=())  # (VM, its full identity)
    # When the feed's id cannot be the agent's (a GCE system event: the agent anchors its id on when it
    # first saw the value), the moment the centre saw it happen: the agent's report is then the notice
    # of the same kind for the VM within MATCH_WINDOW of it. Such a report is never drained on: by the
    # time the log has it, the maintenance is happening.
    matched_by_time: datetime | None = None

    def __post_init__(self) -> None:
        if self.source not in CENTRAL_SOURCES:
            raise ValueError(f"unknown central source {self.source!r}; known: {', '.join(CENTRAL_SOURCES)}")
        if not self.vms:
            raise ValueError("a central report names at least one VM")

    def part(self, vm: str) -> MaintenanceEvent:
        """The VM's own part of the event, as its agent would have reported it."""
        return MaintenanceEvent(
            cloud=self.cloud,
            event_id=self.event_id,
            kind=self.kind,
            status=self.status,
            reporter=vm,
            sequence=f"{self.source}:{self.notice_id}",
            resources=(vm,),
            not_before=self.not_before,
            duration_seconds=self.duration_seconds,
            event_source=self.event_source,
            description=self.description,
            raw={"source": self.source, "notice_id": self.notice_id, "vms": len(self.vms)},
        )

    def identity(self, vm: str) -> str:
        return dict(self.identities).get(vm, "")

    def to_bytes(self, vm: str) -> bytes:
        """The VM's part of this report, as the watch line keeps it."""
        document: dict[str, Any] = {
            "cloud": self.cloud.value,
            "event_id": self.event_id,
            "kind": self.kind.value,
            "status": self.status.value,
            "vm": vm,
            "source": self.source,
            "notice_id": self.notice_id,
            "not_before": format_rfc3339(self.not_before) if self.not_before else None,
            "duration_seconds": self.duration_seconds,
            "event_source": self.event_source.value if self.event_source else None,
            "description": self.description,
            "identity": self.identity(vm),
            "matched_by_time": format_rfc3339(self.matched_by_time) if self.matched_by_time else None,
        }
        return json.dumps(document, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> CentralReport:
        document = json.loads(data)
        vm = document["vm"]
        return cls(
            cloud=Cloud(document["cloud"]),
            event_id=document["event_id"],
            kind=EventKind(document["kind"]),
            status=EventStatus(document["status"]),
            vms=(vm,),
            source=document["source"],
            notice_id=document["notice_id"],
            not_before=parse_rfc3339(document["not_before"]) if document["not_before"] else None,
            duration_seconds=document["duration_seconds"],
            event_source=EventSource(document["event_source"]) if document["event_source"] else None,
            description=document["description"],
            identities=((vm, document["identity"]),) if document["identity"] else (),
            matched_by_time=parse_rfc3339(document["matched_by_time"]) if document.get("matched_by_time") else None,
        )


def process_central(
    report: CentralReport,
    deps: Deps,
    now: datetime,
    *,
    quiet_repeats: bool = False,
    told: InvocationReport | None = None,
) -> list[Outcome]:
    """Act on a report of the control plane, once per VM it names (see the module docstring).

    A repeat of a step this feed already reported for the VM is a duplicate, audited as one; with
    `quiet_repeats` (a feed that is polled, such as Resource Graph, reports every step again on each
    pass) it is a duplicate that writes nothing. What was done is added to `told`, the report of the
    invocation the entry point opened (`reporting`), when given; the first report names its event.

    Raises:
        RetryableError: a transient failure; the feed's message must be redelivered.
    """
    if told is not None and not told.event_id:
        told.event_id, told.cloud, told.source = report.event_id, report.cloud.value, report.source
        told.vm = report.vms[0] if len(report.vms) == 1 else ""
    outcomes = [_part(report, vm, deps, now, quiet_repeats) for vm in report.vms]
    if told is not None:
        tell(told, outcomes)
    return outcomes


def _part(report: CentralReport, vm: str, deps: Deps, now: datetime, quiet_repeats: bool) -> Outcome:
    event = report.part(vm)
    envelope = envelope_for_event(event, now)  # the id the agent's report of this step carries
    key = claim_key(envelope.id, vm, f"central|{report.source}")
    claim = deps.store.claim(key, now, CLAIM_LEASE)
    if claim is Claim.DONE and quiet_repeats:
        return Outcome(envelope.id, Result.DUPLICATE)
    if claim is Claim.DONE:
        deps.audit.append(
            event_record(now, AuditKind.DUPLICATE, envelope, event, action=ActionName.NONE, reason=_repeated(report))
        )
        return Outcome(envelope.id, Result.DUPLICATE)
    if claim is Claim.BUSY:
        raise ClaimBusyError(f"the {report.source} report of {event.event_id} for {vm} is being processed; retry later")
    run = _on_centres_word(deps, now, envelope, event)
    run.path = f"{SENDER_PREFIX}{report.source}"

    def steps() -> None:
        if report.matched_by_time is not None and agent_reported(deps.audit, vm, report):
            # The agent's own report of it, under the agent's id: this is a repeat, not an event.
            reason = f"{vm}'s agent already reported this {event.kind.value} ({report.source}): the same maintenance"
            run.audit(AuditKind.DUPLICATE, action=ActionName.NONE, reason=reason)
            return
        run.audit(AuditKind.EVENT, reason=event.description, detail=report_detail(event, _sender(report, vm)))
        if event.status in ENDING:
            act(run)  # the end, as the agent's would be: what this system drained goes back
            deps.store.unpark(WATCH_LINE, subject_key(event))
        else:
            _watch(run, report, vm)

    return run.carry_through(key, steps)


def _on_centres_word(deps: Deps, now: datetime, envelope: Envelope, event: MaintenanceEvent) -> Invocation:
    """The invocation of a VM's part on the control plane's word: drains and restores only, in the
    trace the event's records of the VM already have (`event_trace`)."""
    outcome = Outcome(envelope.id, Result.PROCESSED, began=deps.monotonic())
    trace = event_trace(deps.audit, event.reporter, event.event_id)
    run = Invocation(deps, now, envelope, event, outcome, trace=trace)
    outcome.trace_id, outcome.part_span = run.trace_id, run.trace
    run.drain_only = True
    return run


def _watch(run: Invocation, report: CentralReport, vm: str) -> None:
    """Keep the VM's part in the watch line for `sweep_silent`, unless its event already ended."""
    ended = recall_end(run.event, run.store)
    if ended is not None:
        reason = f"the event already {ended.status.value} at {ended.time}: nothing to watch"
        run.audit(AuditKind.DECISION, rule=WATCH_RULE, reason=reason)
        return
    # Parked again (a later step), it keeps its place and the time the centre first reported it.
    run.store.park(WATCH_LINE, subject_key(run.event), report.to_bytes(vm), run.now)
    seconds = run.policy.silent_agent_seconds
    reason = f"reported by the control plane: {vm}'s own agent is expected to report it within {seconds:g} s"
    run.audit(AuditKind.DECISION, rule=WATCH_RULE, reason=reason)


def sweep_silent(deps: Deps, now: datetime, most: int = SWEEP_MOST) -> list[Outcome]:
    """The watched parts whose agent has not reported them `silent_agent_seconds` after the centre
    did: audited `agent-silent` (and drained with policy `silent_agents: drain`), once each. Parts
    whose agent reported, or whose event ended, leave the line.

    At most `most` parts are looked at, oldest first (each costs a read of the audit log and a
    delete): in a wave the rest wait for the next sweep, which the oldest then lead. The sweep is
    one invocation of operation `sweep` to telemetry."""
    bound = timedelta(seconds=deps.policy.silent_agent_seconds)
    found: list[Outcome] = []
    with reporting(deps, now, SWEEP) as told:
        for looked, watched in enumerate(deps.store.parked(WATCH_LINE)):
            if looked >= most or now - watched.parked_at < bound:
                break  # the line is in the order the centre reported: the rest are younger
            report = CentralReport.from_bytes(watched.envelope)
            vm = report.vms[0]
            event = report.part(vm)
            if recall_end(event, deps.store) is None and not agent_reported(deps.audit, vm, report):
                found.append(_silent(report, vm, deps, now, watched.parked_at))
                tell(told, found[-1:])
            deps.store.unpark(WATCH_LINE, watched.event_key)
    return found


def agent_reported(audit: AuditLog, vm: str, report: CentralReport) -> bool:
    """Whether the VM's own agent reported the report's event (a report of it acted on, not a refused
    one): under the same id, or for a report matched by time, a notice of the same kind near it."""
    moment = report.matched_by_time
    if moment is None:
        return any(_from_agent(record) for record in audit.query(vm=vm, event_id=report.event_id))
    return any(
        _from_agent(record)
        and record.detail.get("kind") == report.kind.value
        and abs(record.time - moment) <= MATCH_WINDOW
        for record in audit.query(vm=vm)
    )


def event_trace(audit: AuditLog, vm: str, event_id: str) -> TraceContext | None:
    """A new span of the trace the event's records of `vm` have: the agent's report's, else the
    first record's that has one (the centre's earlier report); None when no record has a trace."""
    records = [record for record in audit.query(vm=vm, event_id=event_id) if is_trace_id(record.trace_id)]
    chosen = next((record for record in records if _from_agent(record)), records[0] if records else None)
    return new_trace(chosen.trace_id) if chosen is not None else None


def _from_agent(record: AuditRecord) -> bool:
    return record.kind == AuditKind.EVENT and not str(record.detail.get("sender", "")).startswith(SENDER_PREFIX)


def _silent(report: CentralReport, vm: str, deps: Deps, now: datetime, since: datetime) -> Outcome:
    event = report.part(vm)
    envelope = envelope_for_event(event, now)
    key = claim_key(envelope.id, vm, "agent-silent")
    claim = deps.store.claim(key, now, CLAIM_LEASE)
    if claim is not Claim.CLAIMED:
        return Outcome(envelope.id, Result.DUPLICATE)  # found by another sweep
    run = _on_centres_word(deps, now, envelope, event)
    waited = (now - since).total_seconds()
    reason = (
        f"the control plane ({report.source}) reported {event.kind.value} {event.event_id} {event.status.value} "
        f"{waited:.0f} s ago and {vm}'s agent has not: is it running and able to publish? "
        f"(on the VM: mbridge agent --check; policy silent_agents: {deps.policy.silent_agents})"
    )
    if report.matched_by_time is not None and deps.policy.silent_agents == "drain":
        reason += "; not drained: the maintenance was already under way when the log had it"
    LOGGER.error(
        "agent of %s silent: %s",
        vm,
        reason,
        extra=event_fields(event, envelope_id=envelope.id, result=SILENT_RULE, alert=SILENT_RULE),
    )

    def steps() -> None:
        run.audit(AuditKind.AGENT_SILENT, rule=SILENT_RULE, reason=reason)
        if deps.policy.silent_agents == "drain" and report.matched_by_time is None:
            act(run)

    return run.carry_through(key, steps)


def _sender(report: CentralReport, vm: str) -> str:
    identity = report.identity(vm)
    return f"{SENDER_PREFIX}{report.source}" + (f" as {identity}" if identity else "")


def _repeated(report: CentralReport) -> str:
    return f"reported again by the control plane ({report.source}): already processed"
