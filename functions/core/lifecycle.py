"""Acting on one VM's part of an event, across its lifecycle: the decision's actions in order, the
end of the part (put back, slots freed, waiting events admitted), and steps that come after it.

Delivery is at least once and may be out of order: a `scheduled` or `started` that failed once may
come back after its event's `completed` or `canceled`. Acted on, it would drain VMs that nothing
ever restores and send an approval the agent must refuse. So the end of an event is stored before
anything else is done for it (`mark_ended`), and a later step of that event is only audited as late
(`_late`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from functions.core.actions import approve, drain, perform, pools_of
from functions.core.checks import decode_actionable, malformed_record
from functions.core.decide import NO_RESTORE_KINDS, Approve, Decision, Drain, PerformMaintenance, Restore, decide
from functions.core.invocation import Invocation
from functions.core.keys import ended_key, event_key, own_part, subject_key
from functions.core.ports import ActionName, AuditKind, JsonObject, StateStore
from functions.core.tracing import commands_traced
from wire.errors import BridgeError, MalformedEnvelopeError, PermanentError, RetryableError
from wire.model import EventStatus, MaintenanceEvent
from wire.timefmt import format_rfc3339

# The statuses that end an event: after one of them, no step of the event is acted on.
ENDING = frozenset({EventStatus.COMPLETED, EventStatus.CANCELED})
# The rule name in the audit log of a step that came after its event's end (not a policy rule:
# it is checked before `decide`, which is pure and knows nothing of what was processed before).
LATE_RULE = "late"


@dataclass(frozen=True)
class Ended:
    """How an event ended, as its first processed `completed` / `canceled` envelope said."""

    status: EventStatus
    time: str  # RFC 3339: when the agent saw the event end
    envelope_id: str


def act(run: Invocation) -> None:
    """Decide on the step and take its actions in order; a step of an ended event is only late.

    A reservation this step found expired left room in its pool that no end will announce: the
    pool's waiting line is tried then, as after an end (there is no timer: this is one of the
    invocations that re-check a waiting event, docs/policy.md#disruption-budget).
    """
    _act(run)
    for pool in sorted(run.freed):
        _admit_waiting(run, pool)


def _act(run: Invocation) -> None:
    event = run.event
    if event.status in ENDING and not mark_ended(run):
        _ended_by_another(run)
        return
    decision = decide(event, run.policy, run.now)  # pure: nothing is done until the end is checked
    if run.drain_only:
        decision = _drains_only(decision)
    if event.status not in ENDING:
        ended = _glance(run, decision)
        if ended is not None:
            _late(run, ended, during_drain=False)
            return
    run.outcome.decision = decision
    run.audit(AuditKind.DECISION, rule=decision.rule, reason=decision.reason)
    if not decision.actions:
        if event.status in ENDING:
            # A completed Terminate or Preempt: its VMs are gone and nothing is put back, but the
            # event still lets go of its budget slots and drain records, or its pool would wait
            # for ever.
            end_part(run, decision, nothing=decision.reason, put_back=False)
            return
        run.note(ActionName.NONE, event.reporter, decision)
        return
    for action in decision.actions:
        if not _STEPS[type(action)](run, action, decision):
            return
    if _deleted(event):
        _let_go_of_deleted(run, decision)


def _glance(run: Invocation, decision: Decision) -> Ended | None:
    """Read what the step needs before it acts, together (`StateStore.glance`): the end of its event,
    and when it drains, the drain records of those VMs and a first read of their pools' budgets. The
    end, or None while the event has not ended."""
    event = run.event
    vms = [vm for action in decision.actions if isinstance(action, Drain) for vm in action.vms]
    key = ended_key(event)
    # Only budgets that count: an unlimited pool keeps no record (`actions._reserve`).
    pools = [name for name, (pool, _) in pools_of(vms, run.policy).items() if pool.max_drained is not None]
    run.glanced = run.store.glance([key], event_key(event), vms, pools)
    return _read_end(event, key, run.glanced.recalled.get(key))


def _drains_only(decision: Decision) -> Decision:
    """The decision on the control plane's word: its drains and restores, none of its approvals nor
    maintenance started early (only the VM's own agent may have its maintenance started)."""
    kept = tuple(action for action in decision.actions if isinstance(action, (Drain, Restore)))
    if kept == decision.actions:
        return decision
    return Decision(decision.rule, f"{decision.reason}; on the control plane's word: no approval", kept)


def _drain_step(run: Invocation, action: Drain, decision: Decision) -> bool:
    drained = drain(run, action, decision)
    if drained is None:
        if _deleted(run.event):
            _let_go_of_deleted(run, decision)
        return False  # parked for the budget: the approval waits with it
    # Out for the load balancers once its probe saw the last drain through /readyz (actions.drain).
    run.drained_at = max(run.moment(), drained.out_at) if drained.out_at is not None else run.moment()
    # Check again now that the drains are on record: the end may have been processed since the
    # check in `act`. See `mark_ended` for why one of the two always sees them. A step that recorded
    # a VM removed checked the end with that record (`record_drain_unless`); one that changed nothing
    # (already drained, dry run) reads it.
    key = ended_key(run.event)
    ended = _read_end(run.event, key, drained.ended) if drained.checked else recall_end(run.event, run.store)
    if ended is not None:
        _late(run, ended, during_drain=True)
        return False
    return True


def _approve_step(run: Invocation, action: Approve, decision: Decision) -> bool:
    approve(run, action, decision)
    return True


def _restore_step(run: Invocation, action: Restore, decision: Decision) -> bool:
    end_part(run, decision)
    return True


def _perform_step(run: Invocation, action: PerformMaintenance, decision: Decision) -> bool:
    perform(run, action, decision)
    return True


# Each kind of action, and whether the steps after it may go on.
_STEPS: Mapping[type, Callable[[Invocation, Any, Decision], bool]] = {
    Drain: _drain_step,
    Approve: _approve_step,
    Restore: _restore_step,
    PerformMaintenance: _perform_step,
}


def _deleted(event: MaintenanceEvent) -> bool:
    """A started Terminate or Preempt: the VM is being deleted (or, on GCE, stopped), and no report of
    it may ever come again — its own agent goes with it, and a VM alone in its set has no one else
    to see the event end. A started event cannot be canceled."""
    return event.status is EventStatus.STARTED and event.kind in NO_RESTORE_KINDS


def _let_go_of_deleted(run: Invocation, decision: Decision) -> None:
    """End a deleted VM's part now, as its completion would: drop its drain records (nothing is put
    back), free its budget slots and admit what waits for them, and mark the event ended, so a step
    of it redelivered later is only audited as late instead of draining and holding a slot again."""
    gone = Decision(decision.rule, f"{run.event.kind.value} started: the VM is going, its budget slot is freed")
    end_part(run, gone, nothing=gone.reason, put_back=False)
    mark_ended(run)


def mark_ended(run: Invocation) -> bool:
    """Remember that the event ended, before its drains are read and restored; True when the end kept
    is this path's (a retry or repeat of the same report included), False when the end came first by
    the other path (the agent's report, or the control plane's).

    The order closes the race with a late step processed at the same time: that step records its
    drains removed, checking for the end in the same write or after it (`record_drain_unless`).
    Either its check sees this mark (and it puts back what it took out itself, from what it holds:
    the record may not be written, or this end may have forgotten it), or the mark came later — and
    so did the completion's read of the drains, which then finds them removed and restores them.
    Both may happen; restoring twice is harmless. The first end
    processed wins (`remember`); a redelivered or second end changes nothing. Two reports of one end
    (the VM's agent and the control plane, functions/core/central.py) often come at once: only the
    one kept goes on to put back and free, or both would restore the VM.
    """
    envelope = run.envelope
    value = {"status": run.event.status.value, "time": format_rfc3339(envelope.time), "envelope_id": envelope.id}
    value["path"] = run.path
    kept = run.store.remember(ended_key(run.event), json.dumps(value, sort_keys=True).encode())
    return _same_end(kept, value)


def _same_end(kept: bytes, ours: Mapping[str, str]) -> bool:
    """Whether the end kept came by `ours`'s path; an end written before paths were kept counts as the
    agent's (the only path there was)."""
    try:
        stored = json.loads(kept)
    except ValueError:
        return False
    return isinstance(stored, dict) and stored.get("path", "agent") == ours["path"]


def _ended_by_another(run: Invocation) -> None:
    """An end of the VM's part that another report of it (the agent's, or the control plane's) made
    first: that one puts back and frees; this one only says so."""
    ended = recall_end(run.event, run.store)
    when = f"{ended.status.value} at {ended.time}" if ended is not None else "ended"
    decision = Decision("1-ended", f"already {when} by another report of it: that one puts back what was drained")
    run.outcome.decision = decision
    run.audit(AuditKind.DECISION, rule=decision.rule, reason=decision.reason)


def recall_end(event: MaintenanceEvent, store: StateStore) -> Ended | None:
    """How the event ended, or None while it has not (read only)."""
    key = ended_key(event)
    return _read_end(event, key, store.recall(key))


def _read_end(event: MaintenanceEvent, key: str, stored: bytes | None) -> Ended | None:
    """The end remembered under `key` as `stored` (None: not ended)."""
    if stored is None:
        return None
    try:
        value = json.loads(stored)
        return Ended(EventStatus(value["status"]), str(value["time"]), str(value["envelope_id"]))
    except (ValueError, KeyError, TypeError) as error:
        raise PermanentError(
            f"the end of event {event.event_id} is stored under {key!r} as {stored!r}, which this version cannot "
            f"read ({error}); delete that record, then resubmit the message"
        ) from error


def _late(run: Invocation, ended: Ended, *, during_drain: bool) -> None:
    """A step of an event that already ended: nothing new is done, and the audit log says why.

    What the end itself does is done again (it is idempotent): whatever is still drained for the
    event is put back and its budget slots freed. Normally that is nothing. It is something when
    this invocation drained while the end was being processed (`during_drain`), or when an
    earlier attempt of this step drained, then died before its own re-check.
    """
    status, at = ended.status.value, ended.time
    if during_drain:
        reason = f"late: event {status} at {at} while this step drained; put back what it drained, no approval"
        decision = restoring = Decision(LATE_RULE, reason)
    else:
        decision = Decision(LATE_RULE, f"late: event already {status} at {at}, nothing to do")
        leftover = f"late: event already {status} at {at}; put back what an earlier attempt drained"
        restoring = Decision(LATE_RULE, leftover)
    run.outcome.decision = decision
    run.audit(AuditKind.DECISION, rule=LATE_RULE, reason=decision.reason)
    # As the end decided: a completed Terminate or Preempt restores nothing (the VM is gone).
    end = decide(replace(run.event, status=ended.status), run.policy, run.now)
    put_back = any(isinstance(action, Restore) for action in end.actions)
    end_part(run, restoring, nothing=decision.reason, put_back=put_back)


def end_part(
    run: Invocation, decision: Decision, nothing: str = "nothing drained by this system", put_back: bool = True
) -> None:
    """End the VM's part of the event: put it back (unless `put_back` is off: the VM is gone), drop
    its drain record, free the event's budget slots once none of its VMs is drained in a pool, and
    admit the events waiting for them. `run.event` is a VM's own part (`own_part`): the drains of
    the event's other VMs are theirs to end."""
    store, event = run.store, run.event
    key = event_key(event)
    own = {*event.resources, event.reporter}
    recorded = store.drains(key)
    # What this step took out itself counts as recorded (a step that found the end once its VMs were
    # out): its record may not be written, or the end may have forgotten it after putting back
    # nothing (the VM was not out yet when it read it).
    drained = {vm: record for vm, record in {**run.removed, **recorded}.items() if vm in own}
    pools = pools_of(sorted(own), run.policy)
    if not drained:
        run.note(ActionName.NONE, event.reporter, decision, nothing)
    failures: list[BridgeError] = []
    for vm, record in sorted(drained.items()):
        if run.policy.dry_run:
            # Keep the record: once dry run is off again, the real completion restores it.
            run.note(ActionName.RESTORE, vm, decision, "dry run: not restored")
            continue
        memento: JsonObject = record.get("memento", {})
        if not put_back:
            run.forget(key, vm)
            run.note(ActionName.NONE, vm, decision, "the VM is gone: nothing put back")
            continue
        try:
            if memento:
                with commands_traced(run.command_trace):  # a restore through /readyz is a command to the agent
                    run.deps.balancer.restore(vm, memento)
        except BridgeError as error:
            # Keep its record for the retry; put the others back and free the budget first.
            failures.append(error)
            if vm not in recorded:
                store.record_drain(key, vm, record)  # out on this step's own account: on record for the retry
            reason = f"could not put {vm} back ({error}); its drain is kept and retried: {memento}"
            run.note(ActionName.RESTORE_FAILED, vm, decision, reason)
            continue
        run.forget(key, vm)
        run.note(ActionName.RESTORE, vm, decision)
    # The event is over for this VM: its slots go back even when it could not be put back, or every
    # later event of the pool would wait on a repair (and go undrained when its deadline came) —
    # unless another VM of the event is still drained in that pool and its part has not ended: the
    # slot is the event's. (One whose part ended keeps a record only when it could not be put back.)
    # The drains read above say which: a VM of the event that records its drain after that read has
    # joined the event's reservation before (`actions.drain` reserves first), as it would have before
    # a second read too, so reading again would only narrow the same window.
    others = sorted(vm for vm in recorded if vm not in own)
    for name, (pool, _) in pools.items():
        if pool.max_drained is None:
            continue  # an unlimited pool holds no slot (reservations an earlier version made there expire)
        # The first such VM found keeps the slot: its end is read only until one is found (reading
        # every other VM's end made each completion of an event of N VMs cost N reads).
        in_pool = (vm for vm in others if run.policy.pool_of(vm).name == name)
        if not any(recall_end(own_part(event, vm), store) is None for vm in in_pool):
            store.release(name, key)
    for name in pools:
        # Ended while waiting for the budget, the part leaves the line (nothing to do for it then).
        _admit_waiting(run, name, leaving=subject_key(event))
    if failures:
        _raise_restore_failures(failures)


def _raise_restore_failures(failures: Sequence[BridgeError]) -> None:
    retryable = [error for error in failures if isinstance(error, RetryableError)]
    summary = "; ".join(str(error) for error in failures)
    if retryable:
        raise RetryableError(f"some VMs could not be put back yet: {summary}") from retryable[0]
    raise PermanentError(
        f"some VMs could not be put back: {summary}. Fix the deployment, then resubmit the dead-lettered "
        "message: their drain records are kept and only they are restored."
    ) from failures[0]


def _admit_waiting(run: Invocation, pool: str, leaving: str | None = None) -> None:
    """A slot may be free: the oldest waiting events of the pool go, as far as the budget allows.

    `leaving` (a subject key) is a part that ended: found in the line, it is taken out and not tried.
    A waiting event that ended meanwhile is taken out of the line by `act` (a late step) and the
    next one is tried. That may admit events itself (its end frees its slots), so the line is read
    again after each event rather than walked from a list that may be stale.
    """
    store, outcome = run.store, run.outcome
    tried: set[str] = set()
    while True:
        line = store.parked(pool)
        if leaving is not None and any(parked.event_key == leaving for parked in line):
            store.unpark(pool, leaving)
        waiting = [parked for parked in line if parked.event_key not in tried and parked.event_key != leaving]
        if not waiting:
            return
        parked = waiting[0]
        tried.add(parked.event_key)
        try:
            # Parked by an earlier version, it may be one this version would not have begun.
            envelope = decode_actionable(parked.envelope)
        except MalformedEnvelopeError as exc:
            run.lines.append(malformed_record(parked.envelope, exc, run.now))
            store.unpark(pool, parked.event_key)
            continue
        if not isinstance(envelope.data, MaintenanceEvent):
            store.unpark(pool, parked.event_key)
            continue
        # Parked under its subject key, after its sender was verified: the VM is the key's last part
        # (its proof may have expired since, so it is not checked again).
        event = own_part(envelope.data, parked.event_key.rsplit("|", 1)[-1])
        before = len(outcome.actions)
        act(run.admitting(envelope, event))
        if outcome.actions[before:] and outcome.actions[before].action is ActionName.WAIT:
            return  # still no room; it stays parked (the same entry was re-parked)
        store.unpark(pool, parked.event_key)
        outcome.budget_waits.append(max(0.0, (run.now - parked.parked_at).total_seconds()))
