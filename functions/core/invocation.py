"""One call of `process`: what it may touch (`Deps`), what it acts on (`Invocation`) and what it did
(`Outcome`, one `Taken` per action), and the audit records it writes on the way; and how each entry
point's invocation reports to telemetry (`reporting`, `tell`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from functions.core.decide import Decision
from functions.core.log_fields import event_fields
from functions.core.policy import Policy
from functions.core.ports import (
    ActionName,
    AuditKind,
    AuditLog,
    AuditRecord,
    CommandSender,
    Finishing,
    Glance,
    JsonObject,
    LoadBalancer,
    Maintenance,
    Result,
    StateStore,
)
from functions.core.proofs_seen import ProofsSeen
from functions.core.telemetry import (
    FAILED,
    NO_TELEMETRY,
    NOTHING,
    PROCESS,
    ActionTiming,
    InvocationReport,
    Telemetry,
    report,
)
from functions.core.tracing import span_of
from wire.bounds import AUDIT_RESOURCES, bounded
from wire.commands import Command
from wire.envelope import Envelope
from wire.identity import IdentityVerifier
from wire.model import MaintenanceEvent
from wire.timefmt import format_rfc3339
from wire.tracecontext import TraceContext

# How long one invocation may hold a claim before a redelivery may take it over. The platform's
# function timeout must exceed this plus `ClaimWait.longest` plus the slowest run of actions
# (host.json functionTimeout is 10 minutes; the Cloud Function's timeout 540 s).
CLAIM_LEASE = timedelta(minutes=5)

LOGGER = logging.getLogger("mbridge.functions")


@dataclass(frozen=True)
class ClaimWait:
    """How a delivery that finds its envelope busy waits for the holder to finish or its lease to
    run out. Without one (replay, tests), a busy claim raises ClaimBusyError at once."""

    clock: Callable[[], datetime]
    sleep: Callable[[float], None] = time.sleep
    longest: timedelta = CLAIM_LEASE + timedelta(seconds=15)
    poll_seconds: float = 1.0


@dataclass
class Deps:
    """Everything `process` touches. `signer` signs commands when the deployment has a key;
    `verifier` checks who sent a message (policy `trust: attested`; without one, nothing is
    verified and nothing is done)."""

    store: StateStore
    balancer: LoadBalancer
    sender: CommandSender
    audit: AuditLog
    policy: Policy
    maintenance: Maintenance | None = None
    signer: Callable[[Command], Command] | None = None
    claim_wait: ClaimWait | None = None
    verifier: IdentityVerifier | None = None
    # How long the invocation has taken so far is measured on this clock and added to its `now`.
    monotonic: Callable[[], float] = time.monotonic
    # Proof bindings whose first value this process found in the store: no request when one comes again.
    proofs_seen: ProofsSeen = field(default_factory=ProofsSeen)
    # Spans and metrics of each invocation (functions/core/telemetry.py); off by default.
    telemetry: Telemetry = NO_TELEMETRY


@dataclass(frozen=True)
class Taken:
    """One action as it was taken (or, for `wait` and `none`, not taken), for logs and replay."""

    action: ActionName
    vm: str
    at: datetime | None  # approve: execute_at
    reason: str
    event: MaintenanceEvent
    # When it was taken, and when the agent saw the step it answers: the latencies telemetry measures.
    taken_at: datetime | None = None
    noticed_at: datetime | None = None


@dataclass
class Outcome:
    """What one invocation did, in order."""

    envelope_id: str
    result: Result
    decision: Decision | None = None
    actions: list[Taken] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic, repr=False)  # on `Deps.monotonic`
    trace_id: str = ""  # of the message's maintenance, for the line the app logs about the outcome
    # The span of a VM's part acted on for an invocation of several (the control plane's, a sweep):
    # the report links to it, so the maintenance's trace leads to the delivery that acted on it.
    part_span: TraceContext | None = None
    # Seconds each event admitted from a budget's waiting line had waited there (telemetry).
    budget_waits: list[float] = field(default_factory=list)


@dataclass
class Invocation:
    """One VM's report being acted on: the envelope, that VM's own part of its event, the moment
    the invocation began (`now`), and the outcome every step adds to.

    A parked event admitted by this invocation is acted on as one of its own (`admitting`): same
    dependencies, same clock and outcome, another envelope and event.
    """

    deps: Deps
    now: datetime
    envelope: Envelope
    event: MaintenanceEvent
    outcome: Outcome
    # When this step's VMs were out of their pools: the drain period of its approval counts from then.
    drained_at: datetime | None = None
    # Pools where this step found a reservation expired: their waiting line is tried once it is done.
    freed: set[str] = field(default_factory=set)
    # The audit records of the invocation, in order, not written yet: `process` writes them in one
    # request (`AuditLog.append_all`) before it completes the claim, or before it lets the claim go
    # when something failed (an event admitted from the waiting line adds its own to the same list).
    lines: list[AuditRecord] = field(default_factory=list)
    # What the step read before it acted (`StateStore.glance`): the drains of the VMs it drains, and
    # the first guess at their pools' budgets.
    glanced: Glance | None = None
    # The VMs this step took out of their pools, with their drain records as this step knows them: a
    # step that finds its event ended once they are out puts them back from these (their records may
    # not have been written, or have been forgotten by the end).
    removed: dict[str, JsonObject] = field(default_factory=dict)
    # Drain records of VMs put back, (event key, VM), not forgotten yet: `process` forgets them with the
    # claim's completion (`StateStore.finishing`), or on their own before it lets the claim go. Until
    # then a redelivery finds them and puts those VMs back again, which changes nothing.
    forgotten: list[tuple[str, str]] = field(default_factory=list)
    # A step on the control plane's word (functions/core/central.py), not the VM's own report: its
    # decision keeps the drains and restores, never an approval nor a maintenance started early.
    drain_only: bool = False
    # The path the report came by: the VM's own agent, or a feed of the control plane
    # (functions/core/central.py). Of two reports of one end, only the first path's acts
    # (`lifecycle.mark_ended`); the same path's repeats are the same report.
    path: str = "agent"
    # This invocation's span of the event's trace (functions/core/tracing.py): from the envelope
    # when not given, as for an event admitted from the waiting line (its own envelope's trace).
    trace: TraceContext | None = None
    # Whether the envelope carried a trace context: the commands for the event then carry this span.
    relays_trace: bool = False

    def __post_init__(self) -> None:
        if self.trace is None:
            self.trace, parent = span_of(self.envelope)
            self.relays_trace = parent is not None

    @property
    def trace_id(self) -> str:
        assert self.trace is not None  # set by __post_init__
        return self.trace.trace_id

    @property
    def command_trace(self) -> TraceContext | None:
        """The trace context the commands for the event carry (None: its agent reads none)."""
        return self.trace if self.relays_trace else None

    @property
    def store(self) -> StateStore:
        return self.deps.store

    @property
    def policy(self) -> Policy:
        return self.deps.policy

    def admitting(self, envelope: Envelope, event: MaintenanceEvent) -> Invocation:
        return Invocation(
            self.deps, self.now, envelope, event, self.outcome, lines=self.lines, forgotten=self.forgotten
        )

    @property
    def named(self) -> tuple[str, ...]:
        """Every VM the verified report names (`event` is only its own part): an Azure approval
        starts the event for all of them."""
        reported = self.envelope.data
        resources = reported.resources if isinstance(reported, MaintenanceEvent) else ()
        return resources or (self.event.reporter,)

    def moment(self) -> datetime:
        """The present on the caller's clock: the invocation's `now` plus the time it has taken so far."""
        return self.now + timedelta(seconds=max(0.0, self.deps.monotonic() - self.outcome.began))

    def audit(self, kind: AuditKind | Result, **fields: Any) -> None:
        """Add a record about this step of the event, stamped with the invocation's `now`."""
        self.lines.append(event_record(self.now, kind, self.envelope, self.event, trace_id=self.trace_id, **fields))

    def forget(self, event_key: str, vm: str) -> None:
        """The VM is back in its pools: its drain record goes when the message is done (`forgotten`)."""
        self.forgotten.append((event_key, vm))

    def write_audit(self, then: Finishing | None = None) -> None:
        """Write the records added so far, in order, in one request where the log allows it, and
        then the end of the message in the store (with them where the log allows it)."""
        if self.lines or then is not None:
            self.deps.audit.append_all(list(self.lines), then)
            self.lines.clear()

    def carry_through(self, claim: str, steps: Callable[[], None]) -> Outcome:
        """Run `steps` on a message whose `claim` this invocation holds, then complete the claim after
        the records are written (a claim completed is never processed again, so its records must be in;
        its completion and the drains of the VMs put back go after them, or with them in one commit
        where the audit log shares the store's database).

        When a step fails, what was done until then is written and the claim let go, so the platform's
        retry takes it over at once (if the process dies instead, the lease runs out and the
        redelivery takes over then; its own records say what it finds done)."""
        try:
            steps()
        except Exception:
            try:
                self.write_audit()
                self.forget_now()
            finally:
                self.store.abandon(claim, self.now)
            raise
        self.write_audit(then=self.store.finishing(claim, self.now, self.forgotten))
        return self.outcome

    def forget_now(self) -> None:
        """Forget the drains of the VMs put back so far, on their own (the message failed)."""
        while self.forgotten:
            self.store.forget_drain(*self.forgotten[0])
            del self.forgotten[0]

    def note(
        self,
        action: ActionName,
        vm: str,
        decision: Decision,
        reason: str = "",
        at: datetime | None = None,
        command_id: str = "",
    ) -> None:
        """One action taken (or, for `wait` and `none`, not taken): into the outcome, the audit log
        and one log line whose fields name the event, the VM and, for an approval, its command."""
        reason = bounded(reason or decision.reason)  # the outcome is logged by the apps
        LOGGER.log(
            logging.WARNING if action is ActionName.RESTORE_FAILED else logging.INFO,
            "%s %s: %s",
            action.value,
            bounded(vm, 200),
            reason,
            extra={
                **event_fields(self.event, envelope_id=self.envelope.id, command_id=command_id, trace_id=self.trace_id),
                # the VM acted on (an event's own part may list several, a wait names them all)
                "vm": bounded(vm),
                "action": action.value,
                "rule": decision.rule,
            },
        )
        # Stamped when the action was taken, not when the step arrived: after a slow load balancer the
        # audit log must show when each VM really left its pool (the drain period counts from then).
        taken_at = self.moment()
        self.outcome.actions.append(Taken(action, bounded(vm), at, reason, self.event, taken_at, self.envelope.time))
        record = event_record(
            taken_at,
            AuditKind.ACTION,
            self.envelope,
            self.event,
            action=action,
            rule=decision.rule,
            reason=reason,
            trace_id=self.trace_id,
        )
        self.lines.append(replace(record, vm=vm, at=at))


@contextmanager
def reporting(deps: Deps, now: datetime, operation: str = PROCESS) -> Iterator[InvocationReport]:
    """One invocation of an entry point (`operation`, functions/core/telemetry.py), begun at `now`:
    the block fills the report, which goes to `deps.telemetry` once the block ended, with the time it
    took on `deps.monotonic`: failed, naming the exception's type, when it raised (the exception goes
    on), else what the block's outcomes came to (`tell`), or its first refusal, or `none`.
    A no-op unless MBRIDGE_TELEMETRY is set."""
    told = InvocationReport(started=now, began=deps.monotonic(), operation=operation)
    try:
        yield told
    except Exception as exc:
        told.result, told.error = FAILED, type(exc).__name__
        raise
    finally:
        told.result = told.result or (told.refusals[0] if told.refusals else NOTHING)
        told.ended = told.started + timedelta(seconds=max(0.0, deps.monotonic() - told.began))
        report(deps.telemetry, told)


def tell(told: InvocationReport, outcomes: Sequence[Outcome]) -> None:
    """What `outcomes` did, added to the invocation's report: their timed actions, the budget waits
    they ended, and the result, `processed` once any of them was (else the first one's). A report
    of one outcome takes its envelope id."""
    for outcome in outcomes:
        told.actions += tuple(_timing(taken) for taken in outcome.actions if taken.taken_at is not None)
        told.budget_waits += tuple(outcome.budget_waits)
        if outcome.part_span is not None:
            told.links += (outcome.part_span,)
        if outcome.result is Result.PROCESSED or not told.result:
            told.result = outcome.result.value
    if len(outcomes) == 1 and not told.envelope_id:
        told.envelope_id = outcomes[0].envelope_id


def _timing(taken: Taken) -> ActionTiming:
    assert taken.taken_at is not None  # only actions noted by `Invocation.note` are timed
    return ActionTiming(taken.action.value, taken.taken_at, taken.noticed_at or taken.taken_at, taken.event.not_before)


def event_record(
    now: datetime, kind: AuditKind | Result, envelope: Envelope, event: MaintenanceEvent, **fields: Any
) -> AuditRecord:
    """An audit record about one step of an event, on behalf of the VM it is the part of; `fields`
    add to (or, for `detail`, replace) what every such record says."""
    fields.setdefault("detail", event_detail(event))
    return AuditRecord(
        time=now,
        kind=kind,
        envelope_id=envelope.id,
        event_id=event.event_id,
        vm=event.reporter,
        status=event.status.value,
        **fields,
    )


def report_detail(event: MaintenanceEvent, sender: str) -> JsonObject:
    """What the record of a report (kind `event`) says beside `event_detail`: the event's NotBefore as
    reported (None: none), and who sent it (the VM's agent, or `central.SENDER_PREFIX` and the feed)."""
    not_before = None if event.not_before is None else format_rfc3339(event.not_before)
    return {**event_detail(event), "not_before": not_before, "sender": sender}


def event_detail(event: MaintenanceEvent) -> JsonObject:
    """What every audit record of the event says about it: the first VMs it lists and how many more."""
    detail: JsonObject = {
        "kind": event.kind.value,
        "cloud": event.cloud.value,
        "resources": list(event.resources[:AUDIT_RESOURCES]),
    }
    if len(event.resources) > AUDIT_RESOURCES:
        detail["resources_not_listed"] = len(event.resources) - AUDIT_RESOURCES
    return detail
