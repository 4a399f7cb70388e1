"""The actions a decision asks for, each done so that a retry after a crash finishes it:
drain (within the pools' budget), approve, perform maintenance.

Restoring is the end of an event's part rather than an action of its own: see `lifecycle`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from functions.core import probes
from functions.core.balancers import readiness_part
from functions.core.decide import Approve, Decision, Drain, PerformMaintenance, approval_time
from functions.core.holds import past_the_budget, reservation_expiry
from functions.core.invocation import Invocation
from functions.core.keys import ended_key, event_key, own_part, subject_key
from functions.core.policy import Policy, Pool
from functions.core.ports import ActionName, AuditKind, AuditRecord, JsonObject, Reservation
from functions.core.tracing import commands_traced
from wire.bounds import bounded
from wire.commands import CommandType, decode_command, encode_command, new_command
from wire.envelope import encode
from wire.model import MaintenanceEvent
from wire.timefmt import format_rfc3339, parse_rfc3339

LOGGER = logging.getLogger("mbridge.functions")

# The drain record of a VM: located (memento recorded, removal not yet confirmed) → removed.
LOCATED = "located"
REMOVED = "removed"


@dataclass(frozen=True)
class Drained:
    """What `drain` came to when the VMs are out: whether it checked the end of the event once it had
    recorded them removed (`StateStore.record_drain_unless`: it recorded at least one), and the end
    it found then (None: none, or not checked)."""

    checked: bool = False
    ended: bytes | None = None
    out_at: datetime | None = None  # when the last VM it took out is out for its load balancer


def drain(run: Invocation, action: Drain, decision: Decision) -> Drained | None:
    """Take the action's VMs out of their pools. None when the budget has no room: the step is
    parked, and what follows it (the approval) waits with it. When the end of the event is found as
    a VM is recorded removed, the VMs after it are left alone (the step is late: `lifecycle`)."""
    store, event = run.store, run.event
    key = event_key(event)
    glanced = run.glanced
    records = glanced.drains if glanced is not None else store.drains(key)
    refused, past = _reserve(run, key, action.vms, records)
    if refused is not None:
        pool, why = refused
        store.park(pool.name, subject_key(event), encode(run.envelope), run.now)
        run.note(ActionName.WAIT, ",".join(action.vms), decision, why)
        return None
    if past:
        decision = Decision(decision.rule, f"drained past the budget: {'; '.join(past)}", decision.actions)
    if all(records.get(vm, {}).get("state") == REMOVED for vm in action.vms):
        run.note(ActionName.NONE, ",".join(action.vms), decision, "already drained")
        return Drained()
    checked = False
    last_out: datetime | None = None
    for vm in action.vms:
        record = records.get(vm)
        if record is not None and record.get("state") == REMOVED:
            continue  # drained by an earlier step or attempt of this event
        if run.policy.dry_run:
            run.note(ActionName.DRAIN, vm, decision, "dry run: not drained")
            continue
        if record is None:
            # Where the VM takes traffic is on record before anything changes: whatever dies
            # after this, the retry finishes the removal and the completion puts it all back.
            record = {"memento": run.deps.balancer.locate(vm) or {}, "state": LOCATED, **_what_for(event)}
            store.record_drain(key, vm, record)
        memento: JsonObject = record["memento"]
        if memento:
            with commands_traced(run.command_trace):  # a drain through /readyz is a command to the agent
                run.deps.balancer.remove(vm, memento)
        # When it was out: an approval of an event of several VMs counts its drain period from the last
        # one. Out through /readyz, it is out once the balancers' probes have seen it (as read when it
        # was located, else the policy's readiness_probe_seconds), not when the agent was told.
        out_at = run.moment()
        readiness = readiness_part(memento) if memento else None
        probe = None if readiness is None else probes.delay(readiness, run.policy, vm)
        if probe is not None:
            out_at += timedelta(seconds=probe.seconds)
        last_out = out_at if last_out is None else max(last_out, out_at)
        drained_at = format_rfc3339(out_at)
        removed = {"memento": memento, "state": REMOVED, "drained_at": drained_at, **_what_for(event)}
        run.removed[vm] = removed
        # Recorded removed unless the event ended meanwhile, checked with the record (see
        # `lifecycle.mark_ended`): then the step stops here, and puts back what it took out.
        ended = store.record_drain_unless(key, vm, removed, ended_key(event))
        checked = True
        reason = decision.reason if memento else f"{decision.reason} ({vm} was in no managed pool)"
        run.note(ActionName.DRAIN, vm, decision, reason if probe is None else f"{reason}; {probe.said()}")
        if ended is not None:
            return Drained(checked, ended, last_out)
    return Drained(checked, out_at=last_out)


def _what_for(event: MaintenanceEvent) -> JsonObject:
    """What a drain record says of its event besides its key, for an operator who finds the VM still
    out (`functions.core.recovery`): the kind (a completed Terminate puts nothing back) and NotBefore."""
    not_before = None if event.not_before is None else format_rfc3339(event.not_before)
    return {"kind": event.kind.value, "not_before": not_before}


def pools_of(vms: Sequence[str], policy: Policy) -> dict[str, tuple[Pool, list[str]]]:
    """The budget pools the VMs belong to, each with its VMs, in name order."""
    grouped: dict[str, tuple[Pool, list[str]]] = {}
    for vm in vms:
        pool = policy.pool_of(vm)
        grouped.setdefault(pool.name, (pool, []))[1].append(vm)
    return dict(sorted(grouped.items()))


def _reserve(
    run: Invocation, key: str, vms: Sequence[str], records: Mapping[str, JsonObject]
) -> tuple[tuple[Pool, str] | None, list[str]]:
    """A slot in every pool of the VMs, or none at all: the first pool that refuses is returned with
    why, else why a pool with no room was passed over (`holds.past_the_budget`).

    Slots this attempt took are given back on a refusal, so two events spanning the same pools
    never hold one slot each while waiting for the other's (no deadlock); a pool where the event
    already drained a VM keeps its slot.
    """
    taken: list[Pool] = []
    past: list[str] = []
    pools = pools_of(vms, run.policy)
    expires_at = reservation_expiry(run.event, run.now)
    why_past = past_the_budget(run.event, run.policy, run.now)
    own = subject_key(run.event)
    # An event whose report names only this VM: no other VM's report is expected to join its reservation.
    alone = run.named == (run.event.reporter,)
    # The pools' budgets as the step read them before it acted: each reservation's first read.
    seen = run.glanced.budgets if run.glanced is not None else {}
    for pool, members in pools.values():
        if pool.max_drained is None:
            # An unlimited pool counts nothing: recording its events would only make its one record
            # the hottest key of a wave (every event of the fleet's default pool writes it twice).
            continue
        admission = run.store.reserve(
            pool.name,
            key,
            members,
            pool.max_drained,
            now=run.now,
            expires_at=expires_at,
            alone=alone,
            seen=seen.get(pool.name),
        )
        _expired(run, pool.name, admission.expired)
        held_before = any(vm in records for vm in members)
        refusal = None
        if not admission and why_past is None:
            refusal = f"pool {pool.name!r} is at {_limit(pool)}; waiting for a slot"
        elif admission and admission.expired and why_past is None and not held_before and _behind(run, pool, own):
            # The room an expired reservation left goes to the oldest waiting event, as a released
            # slot does (the line is tried once this invocation is done): this one queues behind it.
            run.store.release(pool.name, key)
            refusal = f"pool {pool.name!r} has room again after an expired reservation; older waiting events go first"
        if refusal is not None:
            for held in taken:
                if not any(vm in records for vm in pools[held.name][1]):
                    run.store.release(held.name, key)
            return (pool, refusal), past
        if not admission:
            # Recorded all the same (no limit), so that it counts against the events after it; and out
            # of the line, where an earlier step of it may wait, so that step is never acted on later.
            run.store.reserve(pool.name, key, members, None, now=run.now, expires_at=expires_at, alone=alone)
            run.store.unpark(pool.name, own)
            past.append(f"{why_past} (pool {pool.name!r} is at {_limit(pool)})")
        elif admission.expired:
            # Admitted into the room an expired reservation left: an earlier step of it may wait there.
            run.store.unpark(pool.name, own)
        taken.append(pool)
    return None, past


def _behind(run: Invocation, pool: Pool, own: str) -> bool:
    """Whether another event waits in the pool's line ahead of this one (read only when a reservation
    expired: a rare extra read)."""
    line = [parked.event_key for parked in run.store.parked(pool.name)]
    return bool(line[: line.index(own)] if own in line else line)


def _limit(pool: Pool) -> str:
    return f"its budget of {pool.max_drained}"


def _expired(run: Invocation, pool: str, expired: Sequence[Reservation]) -> None:
    """Audit the reservations the store found expired and removed (each once: the call that removed
    it reports it), and have the pool's waiting line tried once this invocation is done."""
    for held in expired:
        cloud, _, event_id = held.event_key.partition(":")
        vms = ",".join(held.vms)
        admitted = "before this version recorded it" if held.admitted_at is None else format_rfc3339(held.admitted_at)
        reason = (
            f"the budget slot of event {event_id} in pool {pool!r} expired at {format_rfc3339(held.expires_at)} "
            f"(admitted at {admitted}): no report ended it in time, so it no longer counts; what was drained for "
            f"it stays out until the event ends"
        )
        LOGGER.warning("%s", bounded(reason), extra={"event_id": event_id, "vm": bounded(vms), "pool": pool})
        run.lines.append(
            AuditRecord(
                time=run.moment(),
                kind=AuditKind.ACTION,
                envelope_id=run.envelope.id,
                event_id=event_id,
                vm=vms,
                action=ActionName.NONE,
                reason=reason,
                detail={"cloud": cloud, "pool": pool, "expired": held.event_key},
                # the step that found it expired: the expired event's own trace is its own records'
                trace_id=run.trace_id,
            )
        )
        run.freed.add(pool)


def approve(run: Invocation, action: Approve, decision: Decision) -> None:
    """Send the event's approval, once in effect: a retry re-sends the very same bytes.

    An approval starts the Azure event for every VM it names ("Acknowledging an event allows the
    event to proceed for all Resources in the event, not just the VM that acknowledges the event"),
    while a report moves only its own VM. So after a drain the approval is held until every VM the
    event names is out of its pools, each on its own report; the report that finds them all out sends
    it, to its own agent. A VM whose report never comes holds it for good: Azure then starts the event
    at its NotBefore, which is what would have happened without this system.
    """
    event = run.event
    last_out = run.drained_at
    if run.drained_at is not None and not run.policy.dry_run:
        still_in, last_out = _all_out(run, run.drained_at)
        if still_in:
            reason = f"approval held until {_some(still_in)} out of {'its' if len(still_in) == 1 else 'their'} pools: "
            reason += "Azure starts the event for every VM it names"
            run.note(ActionName.NONE, event.reporter, decision, reason)
            return
    # One approval per step of the event (its envelope id is the same in every VM's report).
    command_id = hashlib.sha256(f"{run.envelope.id}|approve".encode()).hexdigest()[:32]
    execute_at = action.execute_at
    if execute_at is not None and last_out is not None:
        # The drain period counts from when the VMs were out of their pools, not from when the step
        # arrived: a load balancer that takes longer than the period to answer must not use it up
        # (the approval would go out with the drain, and connections be cut).
        execute_at = approval_time(event, run.policy, last_out)
    # Issued now, not when the step arrived: the time-to-live (longer than the drain period, the
    # policy checks) runs from here, so a slow drain never makes the command expire before it runs.
    issued_at = run.moment()
    built = new_command(
        CommandType.APPROVE,
        target=event.reporter if run.drained_at is not None else action.target,
        event_id=event.event_id,
        issued_at=issued_at,
        execute_at=execute_at if execute_at and execute_at > issued_at else None,
        expires_at=issued_at + timedelta(seconds=run.policy.command_ttl_seconds),
        command_id=command_id,
        trace=run.command_trace,
    )
    if run.deps.signer is not None:
        built = run.deps.signer(built)
    # A retry re-sends the very bytes of the first attempt (see Memory.remember).
    command = decode_command(run.store.remember(f"command:{command_id}", encode_command(built))).command
    if command.target != built.target:
        # Another VM's report of the step approved it already (or its retry will send it): one
        # approval starts the event for every VM it names.
        run.note(ActionName.NONE, event.reporter, decision, f"approved already, through {command.target}'s agent")
        return
    if run.policy.dry_run:
        run.note(ActionName.APPROVE, command.target, decision, "dry run: not sent", command_id=command_id)
        return
    run.deps.sender.send(command)
    run.note(ActionName.APPROVE, command.target, decision, at=command.execute_at, command_id=command_id)


def _all_out(run: Invocation, own_drained_at: datetime) -> tuple[list[str], datetime]:
    """The VMs the event names that are not out of their pools yet (each leaves on its own report)
    nor done with the event, and when the last of those that are out left (a record of an earlier
    version has no time: now)."""
    still_in: list[str] = []
    last_out = own_drained_at
    others = [vm for vm in run.named if vm != run.event.reporter]  # the reporter was drained by this very step
    if not others:
        return still_in, last_out  # nothing to read: the event names no other VM
    records = run.store.drains(event_key(run.event))
    for vm in others:
        record = records.get(vm)
        if record is None or record.get("state") != REMOVED:
            # A VM whose part already ended (its completion came first: buses reorder) is past it.
            if run.store.recall(ended_key(own_part(run.event, vm))) is None:
                still_in.append(vm)
            continue
        left = parse_rfc3339(record["drained_at"]) if isinstance(record.get("drained_at"), str) else run.moment()
        last_out = max(last_out, left)
    return still_in, last_out


def _some(vms: Sequence[str], shown: int = 3) -> str:
    """A few VMs by name and how many more, with the verb: an event may name a thousand."""
    if len(vms) == 1:
        return f"{vms[0]} is"
    if len(vms) <= shown:
        return f"{', '.join(vms[:-1])} and {vms[-1]} are"
    return f"{', '.join(vms[:shown])} and {len(vms) - shown} more are"


def perform(run: Invocation, action: PerformMaintenance, decision: Decision) -> None:
    """Start GCE's announced maintenance now (instances.performMaintenance)."""
    maintenance = run.deps.maintenance
    if maintenance is None or run.policy.dry_run:
        reason = "dry run: not started" if run.policy.dry_run else "no maintenance adapter configured"
        run.note(ActionName.PERFORM_MAINTENANCE, action.vm, decision, reason)
        return
    maintenance.perform(action.vm)
    run.note(ActionName.PERFORM_MAINTENANCE, action.vm, decision)
