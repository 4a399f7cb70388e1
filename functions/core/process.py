"""`process`: one envelope in, its actions done exactly once in effect (docs/contracts.md#processing).

    decode → verify who sent it → claim (envelope id, VM) → decide → execute (drain / approve / restore / perform)
    → complete

- A verified report speaks only for its own VM. The proof attached by the agent (see
  `wire.identity`) names the VM the message comes from; an event moves that VM — drain,
  approval, restore, budget slot, lifecycle — and no other, whatever the message lists. A message
  without a valid proof is audited as `unverified`, a report about other VMs as `not-self`, and
  nothing is done for either. The claim is taken only after the check and is per (envelope, VM):
  a forged envelope carrying a genuine id can never shadow the genuine report, and every VM of an
  availability set has its own report acted on.

- A duplicate (buses redeliver; an agent republishes after a crash) finds its claim done and is
  acknowledged with no action.
- A crash between claim and completion leaves a claim whose lease runs out; the redelivery takes
  it over and executes again. Every action is idempotent for that: a drain first records where
  the VM takes traffic (read only), then removes it, then marks it removed, so a crash at any
  point is finished by the retry and restored by the completion; approvals are byte-identical
  commands with a deterministic command_id (the agent answers a repeat from its ledger and
  never POSTs twice).
- A delivery that finds its envelope claimed by a live invocation waits for that one to end
  (`ClaimWait`) rather than bouncing straight back to the bus, whose immediate redeliveries
  would dead-letter the message long before a dead invocation's lease runs out.
- Budget waits are stored (`park`), never left to platform redelivery (which would dead-letter):
  the invocation that frees a slot admits the oldest waiting event of the pool. An event whose
  VMs sit in several pools needs a slot in each.
- A restore that fails does not stop the others, nor hold the budget: the slot is released, the
  failed VM's drain record is kept, and the error is raised after the rest is done, so a
  redelivery (or a dead-lettered message resubmitted once the deployment is fixed) retries
  just that VM.
- Delivery is at least once and, on a plain Service Bus subscription or an Eventarc trigger,
  not ordered: a `scheduled` or `started` that failed once may come back after its event's
  `completed` or `canceled`. Acted on, it would drain VMs that nothing ever restores (the end
  already ran) and send an approval the agent must refuse. So the end of an event is stored
  (`ended|<event key>`, see `_mark_ended`) before anything else is done for it, and a later step
  of that event is only audited as late (`_late`). A step that passed the check while its end
  was being processed re-checks once its drains are recorded and puts them back itself.
- Nothing is begun that cannot be carried through: before the claim, an event is checked for
  every text its actions will put into a command, a store key or a bus attribute (`_decode_actionable`).
  One that fails is malformed, like an envelope the decoder refuses: a name no approval can be
  addressed to must not be found after its VMs are drained.
- Malformed envelopes are audited and acknowledged (`PermanentError`); transient adapter
  failures raise `RetryableError` for the platform to retry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from functions.core.decide import (
    NO_RESTORE_KINDS,
    Approve,
    Decision,
    Drain,
    PerformMaintenance,
    Restore,
    approval_time,
    decide,
)
from functions.core.policy import TRUST_REPORTER_NAME, Policy, Pool
from functions.core.ports import (
    ActionName,
    AuditKind,
    AuditLog,
    AuditRecord,
    Claim,
    CommandSender,
    JsonObject,
    LoadBalancer,
    Maintenance,
    Result,
    StateStore,
)
from wire.bounds import AUDIT_RESOURCES, MAX_ENVELOPE_BYTES, MAX_RESOURCES, bounded
from wire.commands import (
    Command,
    CommandType,
    MalformedCommandError,
    check_event_id,
    check_target,
    decode_command,
    encode_command,
    new_command,
)
from wire.envelope import Envelope, decode, encode
from wire.errors import BridgeError, MalformedEnvelopeError, PermanentError, RetryableError
from wire.identity import Identity, IdentityVerifier, ReporterName, UnverifiedError
from wire.model import CommandResult, EventStatus, MaintenanceEvent
from wire.timefmt import format_rfc3339

LOGGER = logging.getLogger("mbridge.functions")

# How long one invocation may hold a claim before a redelivery may take it over. The platform's
# function timeout must exceed this plus `ClaimWait.longest` plus the slowest run of actions
# (host.json functionTimeout is 10 minutes; the Cloud Function's timeout 540 s).
CLAIM_LEASE = timedelta(minutes=5)

# The drain record of a VM: located (memento recorded, removal not yet confirmed) → removed.
LOCATED = "located"
REMOVED = "removed"

# The statuses that end an event: after one of them, no step of the event is acted on.
ENDING = frozenset({EventStatus.COMPLETED, EventStatus.CANCELED})
# The rule name in the audit log of a step that came after its event's end (not a policy rule:
# it is checked before `decide`, which is pure and knows nothing of what was processed before).
LATE_RULE = "late"


class ClaimBusyError(RetryableError):
    """Another invocation is processing the same envelope right now; retry later."""


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


@dataclass(frozen=True)
class Taken:
    """One action as it was taken (or, for `wait` and `none`, not taken), for logs and replay."""

    action: ActionName
    vm: str
    at: datetime | None  # approve: execute_at
    reason: str
    event: MaintenanceEvent


@dataclass
class Outcome:
    """What one invocation did, in order."""

    envelope_id: str
    result: Result
    decision: Decision | None = None
    actions: list[Taken] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic, repr=False)  # on `Deps.monotonic`


def event_key(event: MaintenanceEvent) -> str:
    """The event across its statuses (drains and budget belong to the event, not the step)."""
    event_id = event.event_id.lower() if event.cloud.value == "azure" else event.event_id
    return f"{event.cloud.value}:{event_id}"


@dataclass(frozen=True)
class Ended:
    """How an event ended, as its first processed `completed` / `canceled` envelope said."""

    status: EventStatus
    time: str  # RFC 3339: when the agent saw the event end
    envelope_id: str


def subject_key(event: MaintenanceEvent) -> str:
    """The event as one VM lives it: its own part of the lifecycle and of the budget's waiting line.

    `event` is a VM's own part (`own_part`), whose reporter is that VM.
    """
    return f"{event_key(event)}|{event.reporter}"


def ended_key(event: MaintenanceEvent) -> str:
    """Where the end of the event for its VM is remembered (a key of `StateStore.remember`)."""
    return f"ended|{subject_key(event)}"


def own_part(event: MaintenanceEvent, vm: str) -> MaintenanceEvent:
    """The event as far as `vm`'s own report may move it: that VM, and only that VM."""
    return replace(event, reporter=vm, resources=(vm,))


def claim_key(envelope_id: str, vm: str) -> str:
    """The idempotency key of one VM's report: the envelope id is the same for every VM of an event."""
    return hashlib.sha256(f"{envelope_id}|{vm}".encode()).hexdigest()


def process(body: bytes, deps: Deps, now: datetime, accepted_at: datetime | None = None) -> Outcome:
    """Handle one message body from the events channel.

    `accepted_at` is when the bus took the message (its enqueued or publish time), for the
    sender's proof: a proof that was valid then is accepted after a backlog. Default: `now`.

    Raises:
        RetryableError: a transient failure; the platform must redeliver the message.
    """
    try:
        envelope = _decode_actionable(body)
    except MalformedEnvelopeError as exc:
        return Outcome(_audit_malformed(body, exc, deps, now), Result.MALFORMED)
    identity = _identify(envelope, deps, accepted_at or now, now)
    if isinstance(envelope.data, CommandResult):
        return _audit_result(envelope, envelope.data, identity, deps, now)
    reported = envelope.data
    refusal = _refusal(reported, identity)
    if refusal is not None:
        result, reason = refusal
        deps.audit.append(_record(now, result, envelope, reported, action=ActionName.NONE, reason=reason))
        LOGGER.warning("%s report %s not acted on: %s", result, envelope.id[:16], bounded(reason))
        return Outcome(envelope.id, result)
    assert isinstance(identity, Identity)
    event = own_part(reported, identity.vm)
    key = claim_key(envelope.id, identity.vm)
    claim = deps.store.claim(key, now, CLAIM_LEASE)
    if claim is Claim.BUSY and deps.claim_wait is not None:
        claim, now = _wait_for_claim(key, deps.store, deps.claim_wait)
    if claim is Claim.DONE:
        deps.audit.append(
            _record(now, AuditKind.DUPLICATE, envelope, event, action=ActionName.NONE, reason="already processed")
        )
        return Outcome(envelope.id, Result.DUPLICATE)
    if claim is Claim.BUSY:
        raise ClaimBusyError(
            f"the report of envelope {envelope.id} by {identity.vm} is being processed by another invocation; "
            "retry later"
        )
    outcome = Outcome(envelope.id, Result.PROCESSED, began=deps.monotonic())
    try:
        # What was reported (its VMs, as far as the audit names them) and who vouches for it.
        record = _record(now, AuditKind.EVENT, envelope, event, reason=event.description)
        deps.audit.append(replace(record, detail={**_detail(reported), "sender": _vouched(identity)}))
        _act(envelope, event, deps, now, outcome)
    except Exception:
        # The platform retries: let that retry take the claim over at once. (If this process
        # dies instead, the lease runs out and the redelivery takes over then.)
        deps.store.abandon(key, now)
        raise
    deps.store.complete(key, now)
    return outcome


def _identify(envelope: Envelope, deps: Deps, accepted_at: datetime, now: datetime) -> Identity | str:
    """The VM the message provably comes from, or why that is not known."""
    verifier = deps.verifier
    if verifier is None:
        if deps.policy.trust != TRUST_REPORTER_NAME:
            return (
                "no identity verifier is configured, so no sender can be verified: set the trust settings "
                "(docs/security.md), or policy trust: reporter-name for VMs without a metadata identity"
            )
        verifier = ReporterName()
    try:
        return verifier.verify(envelope, accepted_at, now)
    except UnverifiedError as error:
        return str(error)


def _refusal(event: MaintenanceEvent, identity: Identity | str) -> tuple[Result, str] | None:
    """Why a report may not move anything (`unverified` or `not-self`), or None when it may."""
    if isinstance(identity, str):
        return Result.UNVERIFIED, f"unverified: {identity}"
    if identity.vm != event.reporter:
        return (
            Result.UNVERIFIED,
            f"unverified: the proof is {identity.vm}'s, the report says it comes from {event.reporter}",
        )
    if event.resources and identity.vm not in event.resources:
        return (
            Result.NOT_SELF,
            f"not-self: {identity.vm} reports an event of other VMs; only their own reports move them",
        )
    return None


def _vouched(identity: Identity) -> str:
    if identity.how == TRUST_REPORTER_NAME:
        return f"reported by {identity.vm}, taken at its word (trust: reporter-name)"
    return f"reported by {identity.vm}, {identity.how}" + (f": {identity.detail}" if identity.detail else "")


def _decode_actionable(body: bytes) -> Envelope:
    """The envelope of a message body, if everything its actions need can be carried through.

    Raises:
        MalformedEnvelopeError: the decoder refuses it, or it is larger than a bus message, or it
            is an event with more VMs than a scale set holds, or a VM name or event id that no
            command can carry (the checks of the command codec itself, so none can fail later).
    """
    if len(body) > MAX_ENVELOPE_BYTES:
        raise MalformedEnvelopeError(
            f"the message body is {len(body)} bytes; an envelope is at most {MAX_ENVELOPE_BYTES}"
        )
    envelope = decode(body)
    if isinstance(envelope.data, MaintenanceEvent):
        _check_actionable(envelope.data)
    return envelope


def _check_actionable(event: MaintenanceEvent) -> None:
    """Every VM an action may drain, approve through, restore or start maintenance on, and the event
    id every command and store key carries, as commands require them."""
    if len(event.resources) > MAX_RESOURCES:
        raise MalformedEnvelopeError(
            f"data.resources lists {len(event.resources)} VMs; at most {MAX_RESOURCES} (no scale set holds more)"
        )
    try:
        check_event_id(event.event_id, "data.event_id")
        check_target(event.reporter, "data.reporter")
        for index, vm in enumerate(event.resources):
            check_target(vm, f"data.resources[{index}]")
    except MalformedCommandError as exc:
        raise MalformedEnvelopeError(f"{exc}: no command could carry it, so nothing is done for this event") from exc


def _audit_malformed(body: bytes, error: MalformedEnvelopeError, deps: Deps, now: datetime) -> str:
    """Record a message that is not acted on, under the digest of its body (it has no usable id)."""
    digest = hashlib.sha256(body).hexdigest()
    deps.audit.append(AuditRecord(now, AuditKind.MALFORMED, digest, "", "", action=ActionName.NONE, reason=str(error)))
    LOGGER.warning("malformed envelope %s acknowledged: %s", digest[:16], bounded(str(error)))
    return digest


def _wait_for_claim(key: str, store: StateStore, wait: ClaimWait) -> tuple[Claim, datetime]:
    """Poll the claim until it is done (a duplicate), ours (the holder failed or died), or the wait
    is over (still busy: the platform redelivers)."""
    start = wait.clock()
    while True:
        wait.sleep(wait.poll_seconds)
        now = wait.clock()
        claim = store.claim(key, now, CLAIM_LEASE)
        if claim is not Claim.BUSY or now - start >= wait.longest:
            return claim, now


def _act(envelope: Envelope, event: MaintenanceEvent, deps: Deps, now: datetime, outcome: Outcome) -> None:
    if event.status in ENDING:
        _mark_ended(envelope, event, deps.store)
    else:
        ended = _ended(event, deps.store)
        if ended is not None:
            _late(envelope, event, ended, deps, now, outcome, during_drain=False)
            return
    decision = decide(event, deps.policy, now)
    outcome.decision = decision
    deps.audit.append(_record(now, AuditKind.DECISION, envelope, event, rule=decision.rule, reason=decision.reason))
    if not decision.actions:
        if event.status in ENDING:
            # A completed Terminate or Preempt: its VMs are gone and nothing is put back, but the
            # event still lets go of its budget slots and drain records, or its pool would wait
            # for ever.
            _restore(envelope, event, deps, now, outcome, decision, nothing=decision.reason, put_back=False)
            return
        _note(deps, outcome, now, envelope, event, ActionName.NONE, event.reporter, decision)
        return
    drained_at: datetime | None = None
    for action in decision.actions:
        if isinstance(action, Drain):
            if not _drain(action, envelope, event, deps, now, outcome, decision):
                if _deleted(event):
                    _let_go_of_deleted(envelope, event, deps, now, outcome, decision)
                return  # parked for the budget: the approval waits with it
            drained_at = _moment(deps, now, outcome)
            # Check again now that the drains are on record: the end may have been processed
            # since the check above. See `_mark_ended` for why one of the two always sees them.
            ended = _ended(event, deps.store)
            if ended is not None:
                _late(envelope, event, ended, deps, now, outcome, during_drain=True)
                return
        elif isinstance(action, Approve):
            _approve(action, envelope, event, deps, now, outcome, decision, drained_at)
        elif isinstance(action, Restore):
            _restore(envelope, event, deps, now, outcome, decision)
        elif isinstance(action, PerformMaintenance):
            _perform(action, envelope, event, deps, now, outcome, decision)
    if _deleted(event):
        _let_go_of_deleted(envelope, event, deps, now, outcome, decision)


def _deleted(event: MaintenanceEvent) -> bool:
    """A started Terminate or Preempt: the VM is being deleted (or, on GCE, stopped), and no report of
    it may ever come again — its own agent goes with it, and a VM alone in its set has no one else
    to see the event end. A started event cannot be canceled."""
    return event.status is EventStatus.STARTED and event.kind in NO_RESTORE_KINDS


def _let_go_of_deleted(
    envelope: Envelope, event: MaintenanceEvent, deps: Deps, now: datetime, outcome: Outcome, decision: Decision
) -> None:
    """End a deleted VM's part now, as its completion would: drop its drain records (nothing is put
    back), free its budget slots and admit what waits for them, and mark the event ended, so a step
    of it redelivered later is only audited as late instead of draining and holding a slot again."""
    gone = Decision(decision.rule, f"{event.kind.value} started: the VM is going, its budget slot is freed")
    _restore(envelope, event, deps, now, outcome, gone, nothing=gone.reason, put_back=False)
    _mark_ended(envelope, event, deps.store)


def _mark_ended(envelope: Envelope, event: MaintenanceEvent, store: StateStore) -> None:
    """Remember that the event ended, before its drains are read and restored.

    The order closes the race with a late step processed at the same time: that step records its
    drains, then checks for the end. Either its check sees this mark (and it restores its drains
    itself), or the mark came later — and so did the completion's read of the drains, which then
    finds them and restores them. Both may happen; restoring twice is harmless. The first end
    processed wins (`remember`); a redelivered or second end changes nothing.
    """
    value = {"status": event.status.value, "time": format_rfc3339(envelope.time), "envelope_id": envelope.id}
    store.remember(ended_key(event), json.dumps(value, sort_keys=True).encode())


def _ended(event: MaintenanceEvent, store: StateStore) -> Ended | None:
    """How the event ended, or None while it has not (read only)."""
    key = ended_key(event)
    stored = store.recall(key)
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


def _late(
    envelope: Envelope,
    event: MaintenanceEvent,
    ended: Ended,
    deps: Deps,
    now: datetime,
    outcome: Outcome,
    *,
    during_drain: bool,
) -> None:
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
    outcome.decision = decision
    deps.audit.append(_record(now, AuditKind.DECISION, envelope, event, rule=LATE_RULE, reason=decision.reason))
    # As the end decided: a completed Terminate or Preempt restores nothing (the VM is gone).
    end = decide(replace(event, status=ended.status), deps.policy, now)
    put_back = any(isinstance(action, Restore) for action in end.actions)
    _restore(envelope, event, deps, now, outcome, restoring, nothing=decision.reason, put_back=put_back)


def _drain(
    action: Drain,
    envelope: Envelope,
    event: MaintenanceEvent,
    deps: Deps,
    now: datetime,
    outcome: Outcome,
    decision: Decision,
) -> bool:
    key = event_key(event)
    records = deps.store.drains(key)
    refused = _reserve(key, action.vms, records, deps)
    if refused is not None:
        deps.store.park(refused.name, subject_key(event), _body(envelope), now)
        # An unlimited pool refuses only when its store can record no more drained VMs for now.
        limit = (
            "the most its store can record" if refused.max_drained is None else f"its budget of {refused.max_drained}"
        )
        reason = f"pool {refused.name!r} is at {limit}; waiting for a slot"
        _note(deps, outcome, now, envelope, event, ActionName.WAIT, ",".join(action.vms), decision, reason)
        return False
    if all(records.get(vm, {}).get("state") == REMOVED for vm in action.vms):
        _note(deps, outcome, now, envelope, event, ActionName.NONE, ",".join(action.vms), decision, "already drained")
        return True
    for vm in action.vms:
        record = records.get(vm)
        if record is not None and record.get("state") == REMOVED:
            continue  # drained by an earlier step or attempt of this event
        if deps.policy.dry_run:
            _note(deps, outcome, now, envelope, event, ActionName.DRAIN, vm, decision, "dry run: not drained")
            continue
        if record is None:
            # Where the VM takes traffic is on record before anything changes: whatever dies
            # after this, the retry finishes the removal and the completion puts it all back.
            record = {"memento": deps.balancer.locate(vm) or {}, "state": LOCATED}
            deps.store.record_drain(key, vm, record)
        memento: JsonObject = record["memento"]
        if memento:
            deps.balancer.remove(vm, memento)
        deps.store.record_drain(key, vm, {"memento": memento, "state": REMOVED})
        reason = decision.reason if memento else f"{decision.reason} ({vm} was in no managed pool)"
        _note(deps, outcome, now, envelope, event, ActionName.DRAIN, vm, decision, reason)
    return True


def _pools(vms: Sequence[str], policy: Policy) -> dict[str, tuple[Pool, list[str]]]:
    """The budget pools the VMs belong to, each with its VMs, in name order."""
    grouped: dict[str, tuple[Pool, list[str]]] = {}
    for vm in vms:
        pool = policy.pool_of(vm)
        grouped.setdefault(pool.name, (pool, []))[1].append(vm)
    return dict(sorted(grouped.items()))


def _reserve(key: str, vms: Sequence[str], records: Mapping[str, JsonObject], deps: Deps) -> Pool | None:
    """A slot in every pool of the VMs, or none at all: the first pool that refuses is returned.

    Slots this attempt took are given back on a refusal, so two events spanning the same pools
    never hold one slot each while waiting for the other's (no deadlock); a pool where the event
    already drained a VM keeps its slot.
    """
    taken: list[Pool] = []
    for pool, members in _pools(vms, deps.policy).values():
        if not deps.store.reserve(pool.name, key, members, pool.max_drained):
            for held in taken:
                if not any(vm in records for vm in _pools(vms, deps.policy)[held.name][1]):
                    deps.store.release(held.name, key)
            return pool
        taken.append(pool)
    return None


def _approve(
    action: Approve,
    envelope: Envelope,
    event: MaintenanceEvent,
    deps: Deps,
    now: datetime,
    outcome: Outcome,
    decision: Decision,
    drained_at: datetime | None,
) -> None:
    # One approval per VM of the event: each VM's own report approves its own part.
    command_id = hashlib.sha256(f"{envelope.id}|{action.target}|approve".encode()).hexdigest()[:32]
    execute_at = action.execute_at
    if execute_at is not None and drained_at is not None:
        # The drain period counts from when the VMs were out of their pools, not from when the step
        # arrived: a load balancer that takes longer than the period to answer must not use it up
        # (the approval would go out with the drain, and connections be cut).
        execute_at = approval_time(event, deps.policy, drained_at)
    # Issued now, not when the step arrived: the time-to-live (longer than the drain period, the
    # policy checks) runs from here, so a slow drain never makes the command expire before it runs.
    issued_at = _moment(deps, now, outcome)
    built = new_command(
        CommandType.APPROVE,
        target=action.target,
        event_id=event.event_id,
        issued_at=issued_at,
        execute_at=execute_at if execute_at and execute_at > issued_at else None,
        expires_at=issued_at + timedelta(seconds=deps.policy.command_ttl_seconds),
        command_id=command_id,
    )
    if deps.signer is not None:
        built = deps.signer(built)
    # A retry re-sends the very bytes of the first attempt (see StateStore.remember).
    command = decode_command(deps.store.remember(f"command:{command_id}", encode_command(built))).command
    if deps.policy.dry_run:
        _note(deps, outcome, now, envelope, event, ActionName.APPROVE, action.target, decision, "dry run: not sent")
        return
    deps.sender.send(command)
    _note(deps, outcome, now, envelope, event, ActionName.APPROVE, action.target, decision, at=command.execute_at)


def _restore(
    envelope: Envelope,
    event: MaintenanceEvent,
    deps: Deps,
    now: datetime,
    outcome: Outcome,
    decision: Decision,
    nothing: str = "nothing drained by this system",
    put_back: bool = True,
) -> None:
    """End the VM's part of the event: put it back (unless `put_back` is off: the VM is gone), drop
    its drain record, free the event's budget slots once none of its VMs is drained in a pool, and
    admit the events waiting for them. `event` is a VM's own part (`own_part`): the drains of the
    event's other VMs are theirs to end."""
    key = event_key(event)
    own = {*event.resources, event.reporter}
    drained = {vm: record for vm, record in deps.store.drains(key).items() if vm in own}
    pools = _pools(sorted(own), deps.policy)
    for name in pools:
        deps.store.unpark(name, subject_key(event))  # ended while waiting for the budget: nothing to do
    if not drained:
        _note(deps, outcome, now, envelope, event, ActionName.NONE, event.reporter, decision, nothing)
    failures: list[BridgeError] = []
    for vm, record in sorted(drained.items()):
        if deps.policy.dry_run:
            # Keep the record: once dry run is off again, the real completion restores it.
            _note(deps, outcome, now, envelope, event, ActionName.RESTORE, vm, decision, "dry run: not restored")
            continue
        memento: JsonObject = record.get("memento", {})
        if not put_back:
            deps.store.forget_drain(key, vm)
            _note(
                deps, outcome, now, envelope, event, ActionName.NONE, vm, decision, "the VM is gone: nothing put back"
            )
            continue
        try:
            if memento:
                deps.balancer.restore(vm, memento)
        except BridgeError as error:
            # Keep its record for the retry; put the others back and free the budget first.
            failures.append(error)
            reason = f"could not put {vm} back ({error}); its drain is kept and retried: {memento}"
            _note(deps, outcome, now, envelope, event, ActionName.RESTORE_FAILED, vm, decision, reason)
            continue
        deps.store.forget_drain(key, vm)
        _note(deps, outcome, now, envelope, event, ActionName.RESTORE, vm, decision)
    # The event is over for this VM: its slots go back even when it could not be put back, or every
    # later event of the pool would wait on a repair (and go undrained when its deadline came) —
    # unless another VM of the event is still drained in that pool and its part has not ended: the
    # slot is the event's. (One whose part ended keeps a record only when it could not be put back.)
    others = {vm for vm in deps.store.drains(key) if vm not in own and _ended(own_part(event, vm), deps.store) is None}
    for name in pools:
        if not any(deps.policy.pool_of(vm).name == name for vm in others):
            deps.store.release(name, key)
    for name in pools:
        _admit_waiting(name, deps, now, outcome)
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


def _admit_waiting(pool: str, deps: Deps, now: datetime, outcome: Outcome) -> None:
    """A slot may be free: the oldest waiting events of the pool go, as far as the budget allows.

    A waiting event that ended meanwhile is taken out of the line by `_act` (a late step) and the
    next one is tried. That may admit events itself (its end frees its slots), so the line is read
    again after each event rather than walked from a list that may be stale.
    """
    tried: set[str] = set()
    while True:
        waiting = [parked for parked in deps.store.parked(pool) if parked.event_key not in tried]
        if not waiting:
            return
        parked = waiting[0]
        tried.add(parked.event_key)
        try:
            # Parked by an earlier version, it may be one this version would not have begun.
            envelope = _decode_actionable(parked.envelope)
        except MalformedEnvelopeError as exc:
            _audit_malformed(parked.envelope, exc, deps, now)
            deps.store.unpark(pool, parked.event_key)
            continue
        if not isinstance(envelope.data, MaintenanceEvent):
            deps.store.unpark(pool, parked.event_key)
            continue
        # Parked under its subject key, after its sender was verified: the VM is the key's last part
        # (its proof may have expired since, so it is not checked again).
        event = own_part(envelope.data, parked.event_key.rsplit("|", 1)[-1])
        before = len(outcome.actions)
        _act(envelope, event, deps, now, outcome)
        if outcome.actions[before:] and outcome.actions[before].action is ActionName.WAIT:
            return  # still no room; it stays parked (the same entry was re-parked)
        deps.store.unpark(pool, parked.event_key)


def _moment(deps: Deps, now: datetime, outcome: Outcome) -> datetime:
    """The present on the caller's clock: the invocation's `now` plus the time it has taken so far."""
    return now + timedelta(seconds=max(0.0, deps.monotonic() - outcome.began))


def _perform(
    action: PerformMaintenance,
    envelope: Envelope,
    event: MaintenanceEvent,
    deps: Deps,
    now: datetime,
    outcome: Outcome,
    decision: Decision,
) -> None:
    if deps.maintenance is None or deps.policy.dry_run:
        reason = "dry run: not started" if deps.policy.dry_run else "no maintenance adapter configured"
        _note(deps, outcome, now, envelope, event, ActionName.PERFORM_MAINTENANCE, action.vm, decision, reason)
        return
    deps.maintenance.perform(action.vm)
    _note(deps, outcome, now, envelope, event, ActionName.PERFORM_MAINTENANCE, action.vm, decision)


def _note(
    deps: Deps,
    outcome: Outcome,
    now: datetime,
    envelope: Envelope,
    event: MaintenanceEvent,
    action: ActionName,
    vm: str,
    decision: Decision,
    reason: str = "",
    at: datetime | None = None,
) -> None:
    reason = bounded(reason or decision.reason)  # the outcome is logged by the apps
    outcome.actions.append(Taken(action, bounded(vm), at, reason, event))
    # Stamped when the action was taken, not when the step arrived: after a slow load balancer the
    # audit log must show when each VM really left its pool (the drain period counts from then).
    taken_at = _moment(deps, now, outcome)
    record = _record(taken_at, AuditKind.ACTION, envelope, event, action=action, rule=decision.rule, reason=reason)
    deps.audit.append(replace(record, vm=vm, at=at))


def _record(now: datetime, kind: str, envelope: Envelope, event: MaintenanceEvent, **fields: Any) -> AuditRecord:
    return AuditRecord(
        time=now,
        kind=kind,
        envelope_id=envelope.id,
        event_id=event.event_id,
        vm=event.reporter,
        status=event.status.value,
        detail=_detail(event),
        **fields,
    )


def _detail(event: MaintenanceEvent) -> JsonObject:
    """What every audit record of the event says about it: the first VMs it lists and how many more."""
    detail: JsonObject = {
        "kind": event.kind.value,
        "cloud": event.cloud.value,
        "resources": list(event.resources[:AUDIT_RESOURCES]),
    }
    if len(event.resources) > AUDIT_RESOURCES:
        detail["resources_not_listed"] = len(event.resources) - AUDIT_RESOURCES
    return detail


def _audit_result(
    envelope: Envelope, result: CommandResult, identity: Identity | str, deps: Deps, now: datetime
) -> Outcome:
    """Audit an agent's answer to a command; one its target's proof does not vouch for is `unverified`."""
    if isinstance(identity, str):
        refusal: str | None = identity
    elif identity.vm != result.target:
        refusal = f"the proof is {identity.vm}'s, the result claims to come from {result.target}"
    else:
        refusal = None
    kind = Result.COMMAND_RESULT if refusal is None else Result.UNVERIFIED
    deps.audit.append(
        AuditRecord(
            time=now,
            kind=kind,
            envelope_id=envelope.id,
            event_id=result.event_id,
            vm=result.target,
            action=result.result,
            reason=result.reason if refusal is None else f"unverified: {refusal} (reason given: {result.reason})",
            detail={"command_id": bounded(result.command_id)},
        )
    )
    return Outcome(envelope.id, kind)


def _body(envelope: Envelope) -> bytes:
    return encode(envelope)
