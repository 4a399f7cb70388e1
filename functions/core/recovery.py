"""An operator ending a VM's part of an event by hand, when no report will end it any more.

A VM stays out of its pools when the end of its event is never acted on: its `completed` was lost,
or was dead-lettered and then resubmitted after its proof expired. A resubmitted message is judged
like any other, as of when the bus took it again (`process`): its proof has usually expired by then,
so it is audited `unverified` and moves nothing. Proofs are not taken past their life, because a
replayed old `completed` would put a VM back in the middle of its maintenance.

What such a message would have finished is finished here, through the completion's own path
(`lifecycle.end_part`): put back what the drain record's memento names, drop the record, free the
event's budget slots and admit the events waiting for them. The end is first stored for the VM, as
a completion stores it, so a step of the event redelivered later is only audited as late.

Only an event whose end was seen (a completion processed whose restore failed) is ended without
more ado; one whose end was never seen is ended only when the operator forces it, with a reason:
the event may still be under way, and the VM would take traffic during its maintenance. Every run,
refused or done, is audited as a record of kind `recovery` naming the operator and the reason,
and is one invocation of operation `recover` to telemetry (a refused one counts a refusal,
`RECOVERY_REFUSED`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from datetime import datetime

from functions.core.decide import Decision, Restore, decide
from functions.core.invocation import Deps, Invocation, Outcome, reporting, tell
from functions.core.lifecycle import Ended, end_part, mark_ended, recall_end
from functions.core.ports import ActionName, AuditKind, AuditRecord, RecordedDrain, Result, StateStore
from functions.core.telemetry import RECOVER
from wire.envelope import MAINTENANCE_TYPE_PREFIX, Envelope
from wire.errors import PermanentError
from wire.model import KINDS_BY_CLOUD, Cloud, EventKind, EventStatus, MaintenanceEvent
from wire.timefmt import format_rfc3339, parse_rfc3339

# The rule of the audit records a recovery writes (not a policy rule: an operator's decision).
RECOVERY_RULE = "recovery"
# The refusal telemetry counts for a recovery not done (`RecoveryRefusedError`).
RECOVERY_REFUSED = "recovery-refused"


@dataclass(frozen=True)
class StillDrained:
    """A VM this system drained for an event and has not put back, with what is known of the event."""

    cloud: str
    event_id: str  # as the event key has it (an Azure EventId in lower case)
    vm: str
    state: str  # located (the removal may not have happened) | removed
    drained_at: str | None  # RFC 3339; None for records of earlier versions
    kind: str | None  # None for records of earlier versions
    not_before: str | None  # RFC 3339; None when the event had none, or the record is of an earlier version
    ended: Ended | None  # how the event ended for this VM, when a report of its end was processed


@dataclass(frozen=True)
class Recovery:
    """What an operator asks: end `vm`'s part of event `event_id` (`cloud:id` when two clouds share it)."""

    vm: str
    event_id: str
    operator: str
    reason: str
    force: bool = False


class RecoveryRefusedError(PermanentError):
    """The recovery was not done (and is audited as refused); the message says what to do."""


def still_drained(store: StateStore) -> list[StillDrained]:
    """Every VM still drained, by event then VM, with its event's end when it was seen."""
    return [_described(drain, store) for drain in store.all_drains()]


def recover(deps: Deps, request: Recovery, now: datetime) -> Outcome:
    """End one VM's part of one event as its completion would have; audited whatever happens.

    Raises:
        RecoveryRefusedError: no such drain, or its event's end was never seen and `force` is off.
        BridgeError: the load balancer could not put the VM back (its drain record is kept).
    """
    refused: RecoveryRefusedError | None = None
    with reporting(deps, now, RECOVER) as told:
        told.vm, told.event_id = request.vm, request.event_id
        try:
            outcome = _recover(deps, request, now)
            tell(told, [outcome])
        except RecoveryRefusedError as error:
            # Reported as what it is, a refusal (its result `recovery-refused`), not as a failure.
            told.refuse(RECOVERY_REFUSED)
            refused = error
    if refused is not None:
        raise refused
    return outcome


def _recover(deps: Deps, request: Recovery, now: datetime) -> Outcome:
    found = [entry for entry in still_drained(deps.store) if _names(entry, request)]
    envelope_id = _recovery_id(request, now)
    if len(found) != 1:
        what = "no drain record" if not found else "drain records in several clouds"
        refusal = (
            f"{what} of {request.vm} for event {request.event_id}: `mbridge recover list` shows what is still "
            "drained" + ("" if not found else "; name the event as cloud:id")
        )
        raise _refused(deps, request, now, envelope_id, refusal)
    entry = found[0]
    if entry.ended is None and not request.force:
        refusal = (
            f"the end of event {entry.event_id} was never seen for {request.vm}: the event may still be under way, and "
            "the VM would take traffic during its maintenance. Check that it is over (Azure: the VM's Scheduled "
            "Events no longer list it; GCE: the instance's maintenance-event is NONE), then run again with --force"
        )
        raise _refused(deps, request, now, envelope_id, refusal)
    event = _event_of(entry)
    envelope = Envelope(
        id=envelope_id,
        source=f"/{entry.cloud}/{entry.vm}",
        type=MAINTENANCE_TYPE_PREFIX + event.status.value,
        subject=entry.event_id,
        time=now,
        data=event,
    )
    _audit(deps, request, now, envelope_id, entry, ActionName.RESTORE, _said(request, entry))
    run = Invocation(deps, now, envelope, event, Outcome(envelope_id, Result.PROCESSED, began=deps.monotonic()))
    if entry.ended is None:
        mark_ended(run)  # before the drains are read, as a completion does (`mark_ended` says why)
    # As the end decided: a completed Terminate or Preempt puts nothing back (the VM is gone).
    put_back = any(isinstance(action, Restore) for action in decide(event, deps.policy, now).actions)
    decision = Decision(RECOVERY_RULE, f"recovered by {request.operator}: {request.reason}")
    run.outcome.decision = decision
    try:
        end_part(run, decision, nothing="nothing drained by this system any more", put_back=put_back)
    finally:
        run.write_audit()  # what was done, also when a VM could not be put back
        run.forget_now()  # the records of the VMs put back (no claim here to complete with them)
    return run.outcome


def _described(drain: RecordedDrain, store: StateStore) -> StillDrained:
    cloud, _, event_id = drain.event_key.partition(":")
    record = drain.record
    event = _event(cloud, event_id, drain.vm, record.get("kind"), EventStatus.COMPLETED)
    return StillDrained(
        cloud=cloud,
        event_id=event_id,
        vm=drain.vm,
        state=str(record.get("state", "")),
        drained_at=_text(record.get("drained_at")),
        kind=_text(record.get("kind")),
        not_before=_text(record.get("not_before")),
        ended=None if event is None else recall_end(event, store),
    )


def _names(entry: StillDrained, request: Recovery) -> bool:
    """Whether the drain is the one the operator named: the VM, and the event by id, or as cloud:id."""
    cloud, _, event_id = request.event_id.partition(":")
    if cloud not in {known.value for known in Cloud}:
        cloud, event_id = "", request.event_id
    if entry.cloud == Cloud.AZURE.value:
        same_id = event_id.lower() == entry.event_id.lower()  # Azure EventIds are GUIDs, printed in either case
    else:
        same_id = event_id == entry.event_id
    return entry.vm == request.vm and same_id and cloud in ("", entry.cloud)


def _event_of(entry: StillDrained) -> MaintenanceEvent:
    status = EventStatus.COMPLETED if entry.ended is None else entry.ended.status
    event = _event(entry.cloud, entry.event_id, entry.vm, entry.kind, status)
    if event is None:
        raise PermanentError(
            f"the drain record of {entry.vm} names cloud {entry.cloud!r}, which this version does not know"
        )
    if entry.not_before is None:
        return event
    return replace(event, not_before=parse_rfc3339(entry.not_before))


def _event(cloud: str, event_id: str, vm: str, kind: object, status: EventStatus) -> MaintenanceEvent | None:
    """The VM's own part of the event at `status`, as far as its drain record tells it."""
    try:
        where = Cloud(cloud)
    except ValueError:
        return None
    known = {known.value: known for known in KINDS_BY_CLOUD[where]}
    return MaintenanceEvent(
        cloud=where,
        event_id=event_id,
        kind=known.get(str(kind), EventKind.UNKNOWN),
        status=status,
        reporter=vm,
        sequence=RECOVERY_RULE,
        resources=(vm,),
    )


def _said(request: Recovery, entry: StillDrained) -> str:
    if entry.ended is None:
        seen = "its end was never seen (forced)"
    else:
        seen = f"the event {entry.ended.status.value} at {entry.ended.time}"
    return f"{request.operator} puts {entry.vm} back for event {entry.event_id} by hand, {seen}: {request.reason}"


def _refused(deps: Deps, request: Recovery, now: datetime, envelope_id: str, why: str) -> RecoveryRefusedError:
    _audit(deps, request, now, envelope_id, None, ActionName.NONE, f"refused: {why}")
    return RecoveryRefusedError(f"{request.vm} was not put back: {why}")


def _audit(
    deps: Deps,
    request: Recovery,
    now: datetime,
    envelope_id: str,
    entry: StillDrained | None,
    action: ActionName,
    reason: str,
) -> None:
    """The recovery's own record: who asked, why, and what was known of the event."""
    detail = {
        "operator": request.operator,
        "reason": request.reason,
        "forced": request.force,
        "cloud": None if entry is None else entry.cloud,
        "drained_at": None if entry is None else entry.drained_at,
        "end_seen": None if entry is None or entry.ended is None else entry.ended.time,
    }
    deps.audit.append(
        AuditRecord(
            time=now,
            kind=AuditKind.RECOVERY,
            envelope_id=envelope_id,
            event_id=request.event_id if entry is None else entry.event_id,
            vm=request.vm,
            action=action,
            status="" if entry is None or entry.ended is None else entry.ended.status.value,
            rule=RECOVERY_RULE,
            reason=reason,
            detail=detail,
        )
    )


def _recovery_id(request: Recovery, now: datetime) -> str:
    """The audit records of one run share it (in place of an envelope id)."""
    text = f"recovery|{request.event_id}|{request.vm}|{request.operator}|{format_rfc3339(now)}"
    return "recovery-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
