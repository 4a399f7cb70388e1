"""The rules every StateStore applies, whatever it stores them in (functions/core/ports.py).

Each backend reads what it holds, asks these pure functions what the answer is, and writes the
result atomically its own way (SQLite transaction, Table Storage ETag, Firestore transaction).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from functions.core.holds import LONGEST_HOLD
from functions.core.ports import Claim, Claims, DrainLedger, Glance, Memory, Parked

# Read-then-conditional-write attempts on a pool's one budget record (Table entity, Firestore
# document) before giving up to a redelivery. A failed write means another invocation's went
# through: events admitted and released in the same pool at once. (A VM joining an admitted
# event writes a record of its own, and meets no other.) Giving up sends the report to the back
# of the bus's queue, behind every other report.
BUDGET_ATTEMPTS = 16


def budget_backoff(attempt: int) -> float:
    """Seconds to wait before attempt `attempt + 1` on a budget record another invocation just wrote.

    A few milliseconds, about one round trip, growing with the attempts: the jitter keeps racing
    invocations from colliding again in step, and a longer wait only delays the report (the record
    is free again as soon as the winner's write is done).
    """
    return random.uniform(0.001, 0.005) * (attempt + 1)


# The states of a claim, as every store writes them.
IN_PROGRESS = "in-progress"
DONE = "done"


@dataclass(frozen=True)
class Finish:
    """`StateStore.finishing` of a store that writes the end of a message with its own methods, after
    the audit records (Table Storage: the claims and drains are not in the audit table; SQLite)."""

    claims: Claims
    ledger: DrainLedger
    key: str
    now: datetime
    forgotten: tuple[tuple[str, str], ...] = ()

    def write(self) -> None:
        for event_key, vm in self.forgotten:
            self.ledger.forget_drain(event_key, vm)
        self.claims.complete(self.key, self.now)


def glance_each(
    memory: Memory, ledger: DrainLedger, recall: Sequence[str], event_key: str, vms: Sequence[str]
) -> Glance:
    """`StateStore.glance` of a store that reads each thing in a request of its own (Table Storage,
    SQLite): the remembered values one by one, the event's drains once when VMs are asked (as a
    step read them before), and no budget (its `reserve` reads it)."""
    recalled = {key: memory.recall(key) for key in dict.fromkeys(recall)}
    if not vms:
        return Glance(recalled)
    recorded = ledger.drains(event_key)
    return Glance(recalled, {vm: recorded[vm] for vm in vms if vm in recorded})


def claim_found(state: str | None, lease_until: float | None, now: float) -> Claim:
    """What a claim of a key finds in what is stored for it (no claim yet: both None).

    A completed claim is done for ever; a live lease is busy; a lease that ran out (its
    invocation died) or was abandoned is taken over (CLAIMED: the caller writes a fresh lease).
    Times are seconds since the epoch.
    """
    if state == DONE:
        return Claim.DONE
    if lease_until is not None and lease_until > now:
        return Claim.BUSY
    return Claim.CLAIMED


def joined(held: Sequence[str], vms: Sequence[str]) -> list[str]:
    """The VMs of a reservation after more VMs of its event joined it, in the order they came."""
    return [*held, *(vm for vm in vms if vm not in held)]


def admits(reserved: Iterable[Sequence[str]], vms: Sequence[str], limit: int | None) -> bool:
    """Whether a pool whose events hold `reserved` VMs admits a new event of `vms`.

    It does when `limit` is None, when nothing else is reserved (an event larger than the budget
    still goes alone), or when the pool's VMs, each counted once, stay within `limit` with these.
    """
    if limit is None:
        return True
    held = [set(vms_of) for vms_of in reserved]
    if not held:
        return True
    return len(set(vms).union(*held)) <= limit


def in_line(waiting: Iterable[Parked]) -> list[Parked]:
    """Waiting events in the order they are admitted: oldest first, ties by event key."""
    return sorted(waiting, key=lambda parked: (parked.parked_at, parked.event_key))


def legacy_expiry(now: datetime) -> datetime:
    """The expiry given to a reservation an earlier version wrote without one, by the first call that
    finds it: the longest hold any reservation gets, counted from then (when it was admitted is not
    known, so it is never cut short)."""
    return now + LONGEST_HOLD


def has_expired(expires_at: datetime, now: datetime) -> bool:
    """Whether a reservation no longer counts at `now`."""
    return expires_at <= now
