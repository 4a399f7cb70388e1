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
- Delivery is at least once and not ordered (Service Bus without sessions, Pub/Sub without
  ordering keys: a lane per VM would be one any agent could fill with junk, docs/transports.md):
  a `scheduled` or `started` that failed once may come back after its event's `completed` or
  `canceled`. Acted on, it would drain VMs that nothing ever restores (the end
  already ran) and send an approval the agent must refuse. So the end of an event is stored
  (`ended|<event key>`, see `lifecycle.mark_ended`) before anything else is done for it, and a later step
  of that event is only audited as late (`lifecycle`). A step that passed the check while its end
  was being processed re-checks once its drains are recorded and puts them back itself.
- Nothing is begun that cannot be carried through: before the claim, an event is checked for
  every text its actions will put into a command, a store key or a bus attribute (`checks.decode_actionable`).
  One that fails is malformed, like an envelope the decoder refuses: a name no approval can be
  addressed to must not be found after its VMs are drained.
- Malformed envelopes are audited and acknowledged (`PermanentError`); transient adapter
  failures raise `RetryableError` for the platform to retry.
"""

from __future__ import annotations

import logging
from datetime import datetime

from functions.core.checks import audit_malformed, decode_actionable
from functions.core.invocation import (
    CLAIM_LEASE,
    ClaimWait,
    Deps,
    Invocation,
    Outcome,
    Taken,
    event_record,
    report_detail,
    reporting,
    tell,
)
from functions.core.keys import claim_key, own_part
from functions.core.lifecycle import act
from functions.core.log_fields import event_fields, fields
from functions.core.policy import TRUST_REPORTER_NAME
from functions.core.ports import ActionName, AuditKind, AuditRecord, Claim, Result, StateStore
from functions.core.telemetry import PROOF_REUSED, InvocationReport
from functions.core.tracing import carried_trace, span_of
from wire.bounds import bounded
from wire.envelope import Envelope
from wire.errors import MalformedEnvelopeError, RetryableError
from wire.identity import Identity, ProofExpiredError, ReporterName, UnverifiedError
from wire.model import CommandResult, MaintenanceEvent

__all__ = ["CLAIM_LEASE", "ClaimBusyError", "ClaimWait", "Deps", "Outcome", "Taken", "process"]

LOGGER = logging.getLogger("mbridge.functions")

# Why a report whose proof had expired when the bus took it is not acted on, and what to do instead.
# A resubmitted message is judged like any other, as of when the bus took it again: a proof is not
# taken past its life (a replayed old `completed` would put a VM back in the middle of its
# maintenance), so what such a message would have finished is finished by an operator.
RESUBMITTED_TOO_LATE = (
    "; a report is judged as of when the bus took it, so one resubmitted after its proof expired is not acted on: "
    "if its VM is still drained after its event ended, put it back with `mbridge recover` "
    "(docs/operations.md#recovering-a-vm-left-drained)"
)


class ClaimBusyError(RetryableError):
    """Another invocation is processing the same envelope right now; retry later."""


def process(body: bytes, deps: Deps, now: datetime, accepted_at: datetime | None = None) -> Outcome:
    """Handle one message body from the events channel.

    `accepted_at` is when the bus took the message (its enqueued or publish time), for the
    sender's proof: a proof that was valid then is accepted after a backlog. Default: `now`.

    Raises:
        RetryableError: a transient failure; the platform must redeliver the message.
    """
    with reporting(deps, now) as told:
        outcome = _process(body, deps, now, accepted_at or now, told)
        tell(told, [outcome])
    return outcome


def _process(body: bytes, deps: Deps, now: datetime, accepted_at: datetime, told: InvocationReport) -> Outcome:
    """`process`, telling `told` what it learns on the way (it may fail at any step)."""
    try:
        envelope = decode_actionable(body)
    except MalformedEnvelopeError as exc:
        told.refuse(Result.MALFORMED.value)
        return Outcome(audit_malformed(body, exc, deps, now), Result.MALFORMED)
    told.envelope_id = envelope.id
    identity = _identify(envelope, deps, accepted_at, now)
    if isinstance(envelope.data, CommandResult):
        return _audit_result(envelope, envelope.data, identity, deps, now, told)
    reported = envelope.data
    told.event_id, told.vm, told.cloud = reported.event_id, reported.reporter, reported.cloud.value
    # A report is recorded under its trace whatever becomes of it; the trace is never checked for
    # anything (a forger picks it as freely as any other attribute).
    trace, parent = span_of(envelope)
    told.trace, told.parent_span_id = trace, parent
    relays_trace = parent is not None
    trace_id = trace.trace_id
    refusal = _refusal(reported, identity)
    if refusal is not None:
        result, reason = refusal
        told.refuse(result.value)
        deps.audit.append(
            event_record(now, result, envelope, reported, action=ActionName.NONE, reason=reason, trace_id=trace_id)
        )
        LOGGER.warning(
            "%s report %s not acted on: %s",
            result,
            envelope.id[:16],
            bounded(reason),
            extra=event_fields(reported, envelope_id=envelope.id, result=result.value, trace_id=trace_id),
        )
        return Outcome(envelope.id, result, trace_id=trace_id)
    assert isinstance(identity, Identity)
    forged = _rebound(identity, deps)
    if forged is not None:
        told.refuse(PROOF_REUSED)
        deps.audit.append(
            event_record(
                now, Result.UNVERIFIED, envelope, reported, action=ActionName.NONE, reason=forged, trace_id=trace_id
            )
        )
        LOGGER.error(
            "forged report %s refused: %s",
            envelope.id[:16],
            forged,
            extra=event_fields(
                reported,
                envelope_id=envelope.id,
                result=Result.UNVERIFIED.value,
                alert="proof-reused",
                trace_id=trace_id,
            ),
        )
        return Outcome(envelope.id, Result.UNVERIFIED, trace_id=trace_id)
    event = own_part(reported, identity.vm)
    key = claim_key(envelope.id, identity.vm, envelope.digest)
    claim = deps.store.claim(key, now, CLAIM_LEASE)
    if claim is Claim.BUSY and deps.claim_wait is not None:
        claim, now = _wait_for_claim(key, deps.store, deps.claim_wait)
    if claim is Claim.DONE:
        deps.audit.append(
            event_record(
                now,
                AuditKind.DUPLICATE,
                envelope,
                event,
                action=ActionName.NONE,
                reason="already processed",
                trace_id=trace_id,
            )
        )
        LOGGER.info(
            "duplicate report %s: already processed",
            envelope.id[:16],
            extra=event_fields(event, envelope_id=envelope.id, result=Result.DUPLICATE.value, trace_id=trace_id),
        )
        return Outcome(envelope.id, Result.DUPLICATE, trace_id=trace_id)
    if claim is Claim.BUSY:
        raise ClaimBusyError(
            f"the report of envelope {envelope.id} by {identity.vm} is being processed by another invocation; "
            "retry later"
        )
    outcome = Outcome(envelope.id, Result.PROCESSED, began=deps.monotonic(), trace_id=trace_id)
    run = Invocation(deps, now, envelope, event, outcome, trace=trace, relays_trace=relays_trace)

    def steps() -> None:
        # What was reported (its VMs, as far as the audit names them) and who vouches for it.
        run.audit(AuditKind.EVENT, reason=event.description, detail=report_detail(reported, _vouched(identity)))
        act(run)

    return run.carry_through(key, steps)


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
    except ProofExpiredError as error:
        return str(error) + (RESUBMITTED_TOO_LATE if isinstance(envelope.data, MaintenanceEvent) else "")
    except UnverifiedError as error:
        return str(error)


def _rebound(identity: Identity, deps: Deps) -> str | None:
    """Why a proof that verified is still a forgery: its one-time part came before with another value
    (an Azure document seen with another key, which was ground to match its 10-digit nonce). The
    first value seen is kept for good; None when this is it.

    A document's later messages are the most: they cost one read (a first message, a read and a
    write), and none once this process found the value first (`ProofsSeen`)."""
    binding = identity.binding
    if binding is None:
        return None
    value = binding.value.encode("utf-8")
    if deps.proofs_seen.is_first(binding.key, value):
        return None
    key = f"proof|{binding.key}"
    first = deps.store.recall(key)
    if first is None:
        first = deps.store.remember(key, value)
    if first == value:
        deps.proofs_seen.found_first(binding.key, value)
        return None
    return (
        f"unverified: {identity.vm}'s proof of identity was first seen with another key: this message's key "
        "was made to match it (a forgery; the genuine agent's messages still count)"
    )


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
    # The resource names the instance itself (project, zone, name): a name alone may be another VM's.
    where = f" as {identity.resource}" if identity.resource else ""
    return f"reported by {identity.vm}, {identity.how}{where}" + (f": {identity.detail}" if identity.detail else "")


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


def _audit_result(
    envelope: Envelope,
    result: CommandResult,
    identity: Identity | str,
    deps: Deps,
    now: datetime,
    told: InvocationReport,
) -> Outcome:
    """Audit an agent's answer to a command; one its target's proof does not vouch for is `unverified`."""
    if isinstance(identity, str):
        refusal: str | None = identity
    elif identity.vm != result.target:
        refusal = f"the proof is {identity.vm}'s, the result claims to come from {result.target}"
    else:
        refusal = None
    kind = Result.COMMAND_RESULT if refusal is None else Result.UNVERIFIED
    carried = carried_trace(envelope)
    trace_id = carried.trace_id if carried is not None else ""
    told.event_id, told.vm = result.event_id, result.target
    if carried is not None:  # an answer without a trace context starts none: the exporter picks the span's ids
        told.trace, told.parent_span_id = carried.child(), carried.span_id
    if refusal is not None:
        told.refuse(kind.value)
    LOGGER.log(
        logging.INFO if refusal is None else logging.WARNING,
        "command %s %s by %s%s",
        bounded(result.command_id, 100),
        result.result,
        bounded(result.target, 100),
        "" if refusal is None else f", not taken as its answer: {bounded(refusal)}",
        extra=fields(
            command_id=result.command_id,
            event_id=result.event_id,
            vm=result.target,
            envelope_id=envelope.id,
            result=result.result,
            trace_id=trace_id,
        ),
    )
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
            trace_id=trace_id,
        )
    )
    return Outcome(envelope.id, kind, trace_id=trace_id)
