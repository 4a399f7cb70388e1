"""The ports of the function core: every side effect of `process` goes through one of these.

Each cloud app implements them with its SDKs (Azure: Table Storage, azure-mgmt-network,
Service Bus; GCP: Firestore, google-cloud-compute, Pub/Sub), the local app with SQLite, and
the tests with in-memory fakes. Implementations raise `RetryableError` for transient failures
(the platform redelivers the message) and `PermanentError` when retrying cannot help.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Protocol

from wire.bounds import bounded
from wire.commands import Command

JsonObject = dict[str, Any]


class Claim(str, Enum):
    CLAIMED = "claimed"  # ours to process now
    DONE = "done"  # processed before: a duplicate, acknowledge it
    BUSY = "busy"  # another invocation holds a live lease: retry later


@dataclass(frozen=True)
class Parked:
    """An event waiting for its pool's disruption budget, oldest first."""

    event_key: str
    envelope: bytes
    parked_at: datetime


@dataclass(frozen=True)
class RecordedDrain:
    """One VM this system drained for an event and has not put back: its drain record as stored
    (`{"memento": ..., "state": ..., ...}`, see `functions.core.actions.drain`)."""

    event_key: str
    vm: str
    record: JsonObject


@dataclass(frozen=True)
class Reservation:
    """An event's hold on VMs of a pool's budget, as stored: since when, and until when it counts if
    no report of the event's end lets it go first (`functions.core.holds`)."""

    event_key: str
    vms: tuple[str, ...]
    admitted_at: datetime | None  # None: admitted by an earlier version, which did not record it
    expires_at: datetime


@dataclass(frozen=True)
class Admission:
    """What `Budget.reserve` answered: whether the event is admitted (the truth value), and the
    reservations of the pool it found expired and removed (each is removed, so reported, once)."""

    admitted: bool
    expired: tuple[Reservation, ...] = ()

    def __bool__(self) -> bool:
        return self.admitted


@dataclass(frozen=True)
class Glance:
    """What a step of an event reads before it acts, read together (`StateStore.glance`).

    `recalled`: each key asked → the value remembered under it, or None. `drains`: each VM asked →
    its drain record in the event, for those that have one. `budgets`: each pool asked → the store's
    own first read of its budget, which the step's first `reserve` in that pool takes as `seen` (a
    store that reads the budget in `reserve` itself leaves it empty).
    """

    recalled: Mapping[str, bytes | None]
    drains: Mapping[str, JsonObject] = field(default_factory=dict)
    budgets: Mapping[str, object] = field(default_factory=dict)


class Claims(Protocol):
    """Idempotency claims on envelope ids, each with a lease."""

    def claim(self, key: str, now: datetime, lease: timedelta) -> Claim:
        """Claim an envelope id. A claim whose lease ran out (the invocation died) is taken over."""
        ...

    def complete(self, key: str, now: datetime) -> None: ...

    def abandon(self, key: str, now: datetime) -> None:
        """End an in-progress claim's lease now (the invocation failed and will be retried), so the
        redelivery may take it over at once instead of finding it busy until the lease runs out."""
        ...


class Budget(Protocol):
    """The reservations of each pool's disruption budget."""

    def reserve(
        self,
        pool: str,
        event_key: str,
        vms: Sequence[str],
        limit: int | None,
        *,
        now: datetime,
        expires_at: datetime,
        alone: bool = False,
        seen: object | None = None,
    ) -> Admission:
        """Admit the event into the pool's budget: admitted when the VMs already reserved plus these
        stay within `limit`, or nothing else is reserved, or `limit` is None. Idempotent per event:
        an event admitted already is admitted again, and `vms` it did not hold yet join its
        reservation (another VM's own report of it), whatever the limit; its expiry stays the one it
        was admitted with (a later report never extends a hold).

        A new reservation records `now` and `expires_at`. One whose `expires_at` is not after `now`
        counts for nothing: the call that finds it removes it in the same atomic write (also when it
        refuses the event) and returns it in `expired`, so it is reported once. An event whose own
        reservation expired is admitted afresh, as if it came first. A reservation an earlier
        version wrote has no expiry: the first call that finds it gives it `now + LONGEST_HOLD`
        (`functions.core.holds`), and it counts until then.

        A store that can record only so many reservations per pool (one Table entity, one Firestore
        document) refuses an event that no longer fits while others are reserved: it waits for a
        slot like any other refused event.

        `alone`: the report that asks names no VM but `vms` (no other VM's report of the event is
        expected to join). A store that keeps joins apart from the reservation (Table Storage,
        Firestore) records it with a new reservation, so that its release need not look for joins;
        a VM that joins such a reservation all the same first has that mark taken off, in a write
        conditional on the reservations as read, and then joins as any other.

        `seen`: the pool's budget as this store read it a moment ago (`Glance.budgets`), taken as the
        first read instead of reading it again. It is only a first guess: the write stays conditional
        on the budget being as read, a write that finds it changed reads it again, and a refusal is
        decided on a fresh read.
        """
        ...

    def release(self, pool: str, event_key: str) -> None: ...


class DrainLedger(Protocol):
    """What this system drained for each event, and how to undo it."""

    def record_drain(self, event_key: str, vm: str, memento: JsonObject) -> None:
        """Remember that this system drained `vm` for the event, and how to undo it."""
        ...

    def drains(self, event_key: str) -> Mapping[str, JsonObject]:
        """VM → memento of everything this system drained for the event."""
        ...

    def forget_drain(self, event_key: str, vm: str) -> None: ...

    def all_drains(self) -> Sequence[RecordedDrain]:
        """Every drain record of every event, by event key then VM: what is still out of its pools.

        Not on any event's path (it reads the whole ledger): the operator's recovery
        (`functions.core.recovery`) lists with it what no report put back.
        """
        ...


class Memory(Protocol):
    """Values stored once under a key: command bytes, event ends."""

    def remember(self, key: str, value: bytes) -> bytes:
        """Store `value` under `key` unless something is stored there already; return what is stored.

        Makes retries send byte-identical commands: a command re-built on a retry would carry a
        new issued_at, which the agent refuses as a reused command_id with other content.
        """
        ...

    def recall(self, key: str) -> bytes | None:
        """What `remember` stored under `key`, or None; read only, it never stores anything.

        Lets an invocation ask whether something happened elsewhere (an event ended: see
        `process`) without claiming the key for itself.
        """
        ...


class Parking(Protocol):
    """Events waiting for their pool's budget, stored rather than left to redelivery."""

    def park(self, pool: str, event_key: str, envelope: bytes, now: datetime) -> None:
        """Keep the event waiting in the pool's line. Parked again (a later step of it), it keeps its
        place in line and its `parked_at`, with the newer envelope."""
        ...

    def parked(self, pool: str) -> Sequence[Parked]:
        """The pool's waiting events, oldest first (ties by event key)."""
        ...

    def unpark(self, pool: str, event_key: str) -> None: ...


class Finishing(Protocol):
    """What the store records when a message is done (`StateStore.finishing`): its claim completed
    and the drain records of the VMs it put back forgotten, written after the message's audit
    records (`AuditLog.append_all`'s `then`)."""

    def write(self) -> None:
        """Forget the drains, then complete the claim, each as `forget_drain` and `complete` do."""
        ...


class StateStore(Claims, Budget, DrainLedger, Memory, Parking, Protocol):
    """Idempotency claims, what this system drained, budget reservations, remembered values
    (command bytes, event ends) and stored waits.

    Each method is atomic on its own (SQLite transaction, Table Storage ETag, Firestore
    transaction); `reserve` in particular must never admit two events into the last slot.

    It is the sum of five roles (Claims, Budget, DrainLedger, Memory, Parking) so that each part of
    the core can say which role it needs rather than take the whole store, and a backend's
    implementation is checked, and tested (tests/contract/test_state_store.py), role by role. One
    backend implements them all, as one database holds them.
    """

    def finishing(self, key: str, now: datetime, forgotten: Sequence[tuple[str, str]] = ()) -> Finishing:
        """The end of a message: the claim `key` completed at `now`, and the drains `forgotten`
        ((event key, VM), VMs put back) forgotten. Nothing is written until its `write` is called, or
        until an audit log that shares this store's database puts it in the commit of the message's
        audit records (Firestore)."""
        ...

    def glance(
        self, recall: Sequence[str], event_key: str = "", vms: Sequence[str] = (), pools: Sequence[str] = ()
    ) -> Glance:
        """What a step reads before it acts, in as few requests as the store allows (Firestore: one
        batched read of the documents): the values remembered under `recall` (as `recall`), the drain
        records of `vms` in event `event_key` (as `drains`, for those VMs), and a first read of the
        budgets of `pools` for `reserve` (`seen`). Read only; each value is as it was when read, and
        nothing read here is assumed to hold later but the budgets' first guess, which `reserve` checks.
        """
        ...

    def record_drain_unless(self, event_key: str, vm: str, memento: JsonObject, ended: str) -> bytes | None:
        """Record the drain as `record_drain` does unless a value is remembered under `ended`, and
        return that value (None: there was none, and the drain is recorded).

        It closes the race of a step that drains with the end of its event (see
        `functions.core.lifecycle.mark_ended`): the end is checked after the record is written, or in
        the same atomic write (Firestore: one commit that fails when the end is there; SQLite: one
        transaction). A store that cannot do both in one request writes the record, then reads the
        end (Table Storage). Either way, when an end is returned the caller puts back what it drained
        itself: the record may not be written, or be forgotten by the end that came first.
        """
        ...


class LoadBalancer(Protocol):
    """Takes a VM out of traffic and puts it back exactly as it was.

    A drain is two calls so that a crash can never lose what to put back: `locate` reads where
    the VM takes traffic (nothing changes), the core records that memento, and only then
    `remove` changes the pools. A retry after a crash calls `remove` again with the recorded
    memento; `restore` puts back what the memento names. Both must be idempotent.
    """

    def locate(self, vm: str) -> JsonObject | None:
        """Read only: the memberships of `vm` in the pools this adapter manages, as a JSON memento,
        or None when it is in none of them (then nothing is removed and nothing restored)."""
        ...

    def remove(self, vm: str, memento: JsonObject) -> None:
        """Take `vm` out of what `memento` names; what is already out stays out."""
        ...

    def restore(self, vm: str, memento: JsonObject) -> None:
        """Put `vm` back into what `memento` names; what is already in stays as it is."""
        ...


class CommandSender(Protocol):
    def send(self, command: Command) -> None:
        """Put the command on the commands channel for `command.target`."""
        ...


class Maintenance(Protocol):
    """GCE instances.performMaintenance: start announced maintenance now."""

    def perform(self, vm: str) -> None: ...


class _Term(str, Enum):
    """A word of the audit log: compares equal to its text, and prints as it."""

    def __str__(self) -> str:
        return str(self.value)


class AuditKind(_Term):
    """What an audit record is about."""

    EVENT = "event"  # a report, as it came
    DECISION = "decision"  # the rule that matched
    ACTION = "action"  # one action taken (or not: wait, none)
    COMMAND_RESULT = "command-result"  # an agent's answer to a command
    DUPLICATE = "duplicate"  # a report processed before
    MALFORMED = "malformed"  # not an envelope we can act on
    UNVERIFIED = "unverified"  # no valid proof of who sent it
    NOT_SELF = "not-self"  # a VM reporting an event of other VMs
    RECOVERY = "recovery"  # an operator ending a VM's part of an event by hand (`mbridge recover`)
    AGENT_SILENT = "agent-silent"  # the control plane reported an event of a VM whose agent did not


class ActionName(_Term):
    """What was done for one VM (an audit record of kind `action`)."""

    DRAIN = "drain"
    APPROVE = "approve"
    RESTORE = "restore"
    RESTORE_FAILED = "restore_failed"
    WAIT = "wait"  # for a budget slot
    NONE = "none"
    PERFORM_MAINTENANCE = "perform_maintenance"


class Result(_Term):
    """What one invocation of `process` came to."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    MALFORMED = "malformed"
    UNVERIFIED = "unverified"
    NOT_SELF = "not-self"
    COMMAND_RESULT = "command-result"


@dataclass(frozen=True)
class AuditRecord:
    """One line of the append-only audit log: an event, a decision, an action or a result.

    Every text is cut to `MAX_AUDIT_TEXT` characters, with a marker saying how much was cut: they
    come from envelopes, error messages and load balancers, and a record must fit every store.
    (`detail` is kept small by whoever builds the record: `process` names at most `AUDIT_RESOURCES` VMs.)
    """

    time: datetime
    kind: str  # event | decision | action | command-result | duplicate | malformed | wait
    envelope_id: str
    event_id: str
    vm: str
    action: str = ""  # drain | approve | restore | restore_failed | wait | none | perform_maintenance
    status: str = ""
    rule: str = ""
    reason: str = ""
    at: datetime | None = None  # approve: execute_at
    detail: JsonObject = field(default_factory=dict, hash=False)
    # The W3C trace of the event's maintenance (wire/tracecontext.py); "" in records written before
    # there was one, and in those about no event's trace (a malformed message, an operator's recovery).
    trace_id: str = ""

    def __post_init__(self) -> None:
        for name in _AUDIT_TEXTS:
            # str(): a kind or an action is stored as its plain text
            object.__setattr__(self, name, bounded(str(getattr(self, name))))


_AUDIT_TEXTS = ("kind", "envelope_id", "event_id", "vm", "action", "status", "rule", "reason", "trace_id")


class AuditLog(Protocol):
    def append(self, record: AuditRecord) -> None: ...

    def append_all(self, records: Sequence[AuditRecord], then: Finishing | None = None) -> None:
        """Append the records in their order, in as few requests as the store allows (Table Storage:
        one entity group transaction per VM's partition; Firestore: one commit; SQLite: one
        transaction): `process` writes the records of a message together, before completing its claim.

        `then`, the end of the message in the state store, is written once the records are: by its
        `write`, or in the records' own commit when this log shares the store's database (Firestore:
        one commit holds the records, the claim's completion and the drains forgotten)."""
        ...

    def query(self, *, vm: str | None = None, event_id: str | None = None) -> Sequence[AuditRecord]: ...
