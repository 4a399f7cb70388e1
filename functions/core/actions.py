"""The actions a decision asks for, each done so that a retry after a crash finishes it:
drain (within the pools' budget), approve, perform maintenance.

Restoring is the end of an event's part rather than an action of its own: see `lifecycle`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from functions.core.decide import Approve, Decision, Drain, PerformMaintenance, approval_time
from functions.core.invocation import Invocation
from functions.core.keys import ended_key, event_key, own_part, subject_key
from functions.core.policy import Policy, Pool
from functions.core.ports import ActionName, JsonObject
from wire.commands import CommandType, decode_command, encode_command, new_command
from wire.envelope import encode
from wire.timefmt import format_rfc3339, parse_rfc3339

# The drain record of a VM: located (memento recorded, removal not yet confirmed) → removed.
LOCATED = "located"
REMOVED = "removed"


def drain(run: Invocation, action: Drain, decision: Decision) -> bool:
    """Take the action's VMs out of their pools. False when the budget has no room: the step is
    parked, and what follows it (the approval) waits with it."""
    store, event = run.store, run.event
    key = event_key(event)
    records = store.drains(key)
    refused = _reserve(run, key, action.vms, records)
    if refused is not None:
        store.park(refused.name, subject_key(event), encode(run.envelope), run.now)
        # An unlimited pool refuses only when its store can record no more drained VMs for now.
        limit = (
            "the most its store can record" if refused.max_drained is None else f"its budget of {refused.max_drained}"
        )
        run.note(
            ActionName.WAIT, ",".join(action.vms), decision, f"pool {refused.name!r} is at {limit}; waiting for a slot"
        )
        return False
    if all(records.get(vm, {}).get("state") == REMOVED for vm in action.vms):
        run.note(ActionName.NONE, ",".join(action.vms), decision, "already drained")
        return True
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
            record = {"memento": run.deps.balancer.locate(vm) or {}, "state": LOCATED}
            store.record_drain(key, vm, record)
        memento: JsonObject = record["memento"]
        if memento:
            run.deps.balancer.remove(vm, memento)
        # When it was out: an approval of an event of several VMs counts its drain period from the last one.
        store.record_drain(key, vm, {"memento": memento, "state": REMOVED, "drained_at": format_rfc3339(run.moment())})
        run.note(
            ActionName.DRAIN,
            vm,
            decision,
            decision.reason if memento else f"{decision.reason} ({vm} was in no managed pool)",
        )
    return True


def pools_of(vms: Sequence[str], policy: Policy) -> dict[str, tuple[Pool, list[str]]]:
    """The budget pools the VMs belong to, each with its VMs, in name order."""
    grouped: dict[str, tuple[Pool, list[str]]] = {}
    for vm in vms:
        pool = policy.pool_of(vm)
        grouped.setdefault(pool.name, (pool, []))[1].append(vm)
    return dict(sorted(grouped.items()))


def _reserve(run: Invocation, key: str, vms: Sequence[str], records: Mapping[str, JsonObject]) -> Pool | None:
    """A slot in every pool of the VMs, or none at all: the first pool that refuses is returned.

    Slots this attempt took are given back on a refusal, so two events spanning the same pools
    never hold one slot each while waiting for the other's (no deadlock); a pool where the event
    already drained a VM keeps its slot.
    """
    taken: list[Pool] = []
    pools = pools_of(vms, run.policy)
    for pool, members in pools.values():
        if not run.store.reserve(pool.name, key, members, pool.max_drained):
            for held in taken:
                if not any(vm in records for vm in pools[held.name][1]):
                    run.store.release(held.name, key)
            return pool
        taken.append(pool)
    return None


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
    records = run.store.drains(event_key(run.event))
    still_in, last_out = [], own_drained_at
    for vm in run.named:
        record = records.get(vm)
        if vm == run.event.reporter:
            continue  # drained by this very step
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
