"""`decide(event, policy, now)`: what to do about one maintenance event (docs/contracts.md#default-policy). Pure.

The rules are ordered; the first that matches wins, and its name travels with the decision
into the audit log, so every action can be traced back to the rule that caused it. Waiting
never happens here: a drain period travels with the approval (`execute_at`), and a budget
wait is decided where the budget is (`process`), against stored state.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Union

from functions.core.policy import Policy
from wire.model import Cloud, EventKind, EventSource, EventStatus, MaintenanceEvent


@dataclass(frozen=True)
class Drain:
    """Take these VMs out of their load balancer(s) (one budget unit for the event)."""

    vms: tuple[str, ...]


@dataclass(frozen=True)
class Approve:
    """Send one approval to `target`'s agent; it POSTs at `execute_at` (None: at once)."""

    target: str
    execute_at: datetime | None = None


@dataclass(frozen=True)
class Restore:
    """Put back what this system drained for this event — and nothing else."""


@dataclass(frozen=True)
class PerformMaintenance:
    """GCE: start the announced maintenance now (instances.performMaintenance)."""

    vm: str


Action = Union[Drain, Approve, Restore, PerformMaintenance]

# Kinds whose VM is gone afterwards: restoring it to a load balancer would add a dead backend.
NO_RESTORE_KINDS = frozenset({EventKind.TERMINATE, EventKind.PREEMPT})
GCE_DRAIN_KINDS = frozenset({EventKind.LIVE_MIGRATE, EventKind.HOST_TERMINATE, EventKind.PREEMPT})
# The rule of a notice the agent could not fully read, and the field that makes it one when its
# kind is known (an event whose status is unclear may already be under way).
UNREADABLE_RULE = "unreadable"
UNREADABLE_STATUS = "EventStatus"


@dataclass(frozen=True)
class Decision:
    rule: str
    reason: str
    actions: tuple[Action, ...] = ()


def decide(event: MaintenanceEvent, policy: Policy, now: datetime) -> Decision:
    """The actions for `event`, by the first matching rule of docs/policy.md#the-rules."""
    if event.status in (EventStatus.COMPLETED, EventStatus.CANCELED):
        # A canceled Terminate/Preempt never happened: its VM is still there and comes back.
        if event.kind in NO_RESTORE_KINDS and event.status is EventStatus.COMPLETED:
            return Decision("1-ended", f"{event.kind.value} {event.status.value}: the VM is gone, nothing to restore")
        return Decision("1-ended", f"{event.status.value}: restore what this system drained", (Restore(),))
    if event.kind is EventKind.UNKNOWN or UNREADABLE_STATUS in event.unreadable:
        return _unreadable(event)
    if _harmless_freeze(event, policy):
        if event.status is EventStatus.SCHEDULED:
            return Decision(
                "3-short-freeze",
                f"Freeze of {event.duration_seconds} s: approve at once, no drain",
                (Approve(_approval_target(event)),),
            )
        return Decision("3-short-freeze", f"Freeze of {event.duration_seconds} s started: no action")
    if event.status is EventStatus.STARTED:
        # A new event already started (hardware failure, no notice), or the next step of one
        # handled at `scheduled`: draining is idempotent per VM, so both are the same action.
        return Decision("2-started", "started without (further) notice: drain the VMs in Resources", _drain(event))
    if event.cloud is Cloud.GCE:
        return _gce(event, policy, now)
    target = _approval_target(event)
    if event.event_source is EventSource.USER:
        if not policy.approve_user_events:
            return Decision("4-user", "user-initiated: drain; approvals of user events are off", _drain(event))
        return Decision("4-user", "user-initiated: drain, then approve at once", (*_drain(event), Approve(target)))
    if not policy.approve_platform_events:
        return Decision("5-platform", "platform event: drain; platform approvals are off", _drain(event))
    execute_at = approval_time(event, policy, drained_at=now)
    return Decision(
        "5-platform",
        f"platform {event.kind.value}: drain, {_when_approved(execute_at, policy, now)}",
        (*_drain(event), Approve(target, execute_at=execute_at)),
    )


def _when_approved(execute_at: datetime, policy: Policy, now: datetime) -> str:
    """When a platform event is approved and why, as it was computed: the reason is printed next to
    the approval, so it must say "at once" when NotBefore cut the drain period to nothing."""
    period = f"{policy.drain_period_seconds:g} s drain period"
    if execute_at >= now + timedelta(seconds=policy.drain_period_seconds):
        return f"approve after the {period}"
    margin = f"NotBefore less the {policy.not_before_margin_seconds:g} s margin"
    if execute_at <= now:
        return f"approve at once: the {period} would pass {margin}"
    waited = (execute_at - now).total_seconds()
    return f"approve {waited:g} s after the drain: capped by {margin} (the {period} would pass it)"


def _unreadable(event: MaintenanceEvent) -> Decision:
    """A notice the agent could not fully read (a type or status added after this release, or a
    garbled one): the conservative reading. Its VMs leave their pools, nothing approves it early —
    Azure starts it at its NotBefore on its own, which is the only approval that cannot be wrong —
    and rule 1 restores them once it is over (its kind is unknown, so it is never taken for a
    deletion)."""
    missing = ", ".join(event.unreadable) or "kind"
    return Decision(
        UNREADABLE_RULE,
        f"the agent could not read this notice's {missing}: drain, never approve early (it starts at NotBefore)",
        _drain(event),
    )


def approval_time(event: MaintenanceEvent, policy: Policy, drained_at: datetime) -> datetime:
    """When a platform event's approval may be POSTed if its VMs left their pools at `drained_at`:
    once the drain period is over, but no later than NotBefore less the margin (Azure starts the
    event then anyway), and never before `drained_at`."""
    execute_at = drained_at + timedelta(seconds=policy.drain_period_seconds)
    if event.not_before is not None:
        latest = event.not_before - timedelta(seconds=policy.not_before_margin_seconds)
        execute_at = max(drained_at, min(execute_at, latest))
    return execute_at


def _gce(event: MaintenanceEvent, policy: Policy, now: datetime) -> Decision:
    if event.kind in GCE_DRAIN_KINDS:
        return Decision("6-gce", f"GCE {event.kind.value}: drain", _drain(event))
    can_reschedule = _can_reschedule(event)
    if (
        policy.gce_upcoming_action == "perform_maintenance"
        and can_reschedule
        and policy.in_maintenance_window(now.astimezone(timezone.utc).hour)
    ):
        return Decision(
            "6-gce-upcoming",
            "upcoming maintenance in the maintenance window: drain and start it now",
            (*_drain(event), PerformMaintenance(event.reporter)),
        )
    return Decision("6-gce-upcoming", "upcoming maintenance: audit only (advance notice)")


def _can_reschedule(event: MaintenanceEvent) -> bool:
    value = event.raw.get("value")
    flag = value.get("canReschedule") if isinstance(value, dict) else None
    return flag is True or (isinstance(flag, str) and flag.strip().lower() == "true")


def _harmless_freeze(event: MaintenanceEvent, policy: Policy) -> bool:
    return (
        event.kind is EventKind.FREEZE
        and event.duration_seconds is not None
        and 0 <= event.duration_seconds <= policy.harmless_freeze_seconds
    )


def _approval_target(event: MaintenanceEvent) -> str:
    """One approval per event: the reporter if it is affected, else the first VM in Resources.

    Either way the approving agent is one of the affected VMs — for a VMSS Terminate, an instance
    being deleted — even when the first report processed came from another VM of the set (every
    report of an event carries the same envelope id, so only the first one is acted on).
    """
    if event.concerns_reporter or not event.resources:
        return event.reporter
    return event.resources[0]


def _drain(event: MaintenanceEvent) -> tuple[Action, ...]:
    vms = event.resources or (event.reporter,)
    return (Drain(tuple(vms)),)
