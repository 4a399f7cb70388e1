"""The StateStore port over one table: claims, budgets, drains, remembered values and waits, each in
partitions of their own, made atomic with ETags (see the package docstring for the layout)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, overload

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableEntity, TableTransactionError, UpdateMode

from functions.azure_app.tables.ends import (
    REMEMBERED,
    EarlierEnds,
    EndRows,
    already_exists,
    drain_partition,
    end_rows,
    is_end_row,
)
from functions.azure_app.tables.entities import (
    bytes_of,
    bytes_properties,
    escape_key,
    fits_in_an_entity,
    text_of,
    text_properties,
    unescape_key,
)
from functions.azure_app.tables.errors import TableStorageUnavailableError, table_errors
from functions.core.ports import Admission, Claim, Finishing, Glance, JsonObject, Parked, RecordedDrain, Reservation
from functions.core.store_rules import (
    BUDGET_ATTEMPTS,
    DONE,
    IN_PROGRESS,
    Finish,
    admits,
    budget_backoff,
    claim_found,
    glance_each,
    has_expired,
    in_line,
    joined,
    legacy_expiry,
)

LOGGER = logging.getLogger("mbridge.functions.azure.tables")

_CLAIMS, _BUDGET, _REMEMBERED = "claims", "budget", REMEMBERED
# A filter holds at most 15 comparisons (https://learn.microsoft.com/rest/api/storageservices/querying-tables-and-entities):
# the partition's and at most 14 rows.
_MOST_ROWS_IN_A_FILTER = 14


class TableStateStore:
    """StateStore over one table (see the module docstring for the layout)."""

    def __init__(
        self,
        table: TableClient,
        *,
        attempts: int = BUDGET_ATTEMPTS,
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._table = table
        self._attempts = attempts
        self._sleep = sleep
        self._earlier_ends = EarlierEnds(table, now, monotonic)

    # ---- claims

    def claim(self, key: str, now: datetime, lease: timedelta) -> Claim:
        stamp = now.timestamp()
        entity = {
            "PartitionKey": _CLAIMS,
            "RowKey": escape_key(key),
            "state": IN_PROGRESS,
            "lease_until": stamp + lease.total_seconds(),
            "updated_at": stamp,
        }
        with self._errors("claim an envelope"):
            try:
                self._table.create_entity(entity)
                return Claim.CLAIMED
            except ResourceExistsError:
                pass
            current = self._table.get_entity(_CLAIMS, escape_key(key))
            found = claim_found(current["state"], current["lease_until"], stamp)
            if found is not Claim.CLAIMED:
                return found
            try:  # the lease ran out: its invocation died; take it over unless someone just did
                self._replace(entity, current)
            except ResourceModifiedError:
                return Claim.BUSY
            return Claim.CLAIMED

    def finishing(self, key: str, now: datetime, forgotten: Sequence[tuple[str, str]] = ()) -> Finishing:
        # The claims and drains are in this table, the audit records in another: no one request holds them.
        return Finish(self, self, key, now, tuple(forgotten))

    def complete(self, key: str, now: datetime) -> None:
        entity = {"PartitionKey": _CLAIMS, "RowKey": escape_key(key), "state": DONE, "updated_at": now.timestamp()}
        with self._errors("complete a claim"):
            try:
                self._table.update_entity(entity, mode=UpdateMode.MERGE)
            except ResourceNotFoundError:
                LOGGER.warning("completing envelope %s that was never claimed; nothing recorded", key)

    def abandon(self, key: str, now: datetime) -> None:
        entity = {"PartitionKey": _CLAIMS, "RowKey": escape_key(key), "lease_until": now.timestamp()}
        with self._errors("abandon a claim"):
            try:
                current = self._table.get_entity(_CLAIMS, escape_key(key))
            except ResourceNotFoundError:
                return
            if current["state"] == DONE:
                return
            try:
                self._table.update_entity(
                    entity,
                    mode=UpdateMode.MERGE,
                    etag=current.metadata["etag"],
                    match_condition=MatchConditions.IfNotModified,
                )
            except (ResourceModifiedError, ResourceNotFoundError):
                return  # someone else moved on with it: nothing to give back

    # ---- budget

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
        del seen  # the budget entity is read here, with its ETag for the conditional write
        row = escape_key(pool)
        found: list[Reservation] = []  # expired reservations this call removed
        with self._errors("reserve a budget slot"):
            for attempt in range(self._attempts):
                read = _Budget.read(self._table, row)
                budget, expired = read.swept(now)
                swept = budget != read
                if event_key in budget.reservations:
                    if swept:
                        if not self._write_budget(row, budget, read):
                            self._sleep(budget_backoff(attempt))
                            continue
                        found += self._forget_expired(pool, read, expired)
                    if self._join(pool, row, event_key, budget, vms):
                        return Admission(True, tuple(found))
                    continue  # the event let its slot go meanwhile: admit it afresh
                counted = budget.reservations
                # Reservations still marked alone have no joins (a join takes the mark off first, in
                # a write this one's would then fail on): the joins are queried only past them.
                if limit is not None and counted and not set(counted) <= budget.alone:
                    counted = self._with_joins(pool, budget)
                admitted = budget.admitting(event_key, vms, now, expires_at, alone=alone)
                if not admits(counted.values(), vms, limit):
                    admitted = budget
                elif len(admitted.reservations) > 1 and not fits_in_an_entity(admitted.text()):
                    # The pool's one entity is full: the event waits for a slot as for a budget (an
                    # event alone always fits: at most 1,000 VMs of 80 characters).
                    LOGGER.warning("the reservations of pool %s fill their entity: %s waits", pool, event_key)
                    admitted = budget
                if admitted is budget and not swept:
                    return Admission(False, tuple(found))
                # Written also when the event waits, if it found reservations expired (or of an earlier
                # version): their removal (or expiry) is then on record, and reported by this call only.
                if self._write_budget(row, admitted, read):
                    found += self._forget_expired(pool, read, expired)
                    return Admission(admitted is not budget, tuple(found))
                self._sleep(budget_backoff(attempt))
        raise TableStorageUnavailableError(
            f"the budget of pool {pool!r} changed under {self._attempts} attempts to reserve a slot; retry later"
        )

    def _forget_expired(self, pool: str, read: _Budget, expired: Sequence[Reservation]) -> list[Reservation]:
        """The joins of reservations just removed as expired (they would count for nothing, but stay)."""
        for held in expired:
            self._forget_joins(pool, held.event_key, read.tokens.get(held.event_key, ""))
        return list(expired)

    def release(self, pool: str, event_key: str) -> None:
        row = escape_key(pool)
        with self._errors("release a budget slot"):
            for attempt in range(self._attempts):
                budget = _Budget.read(self._table, row)
                if event_key not in budget.reservations:
                    return
                token = budget.tokens.get(event_key, "")
                # Admitted alone and never joined (a join takes the mark off first): no joins to look for.
                joins = event_key not in budget.alone
                if self._write_budget(row, budget.releasing(event_key), budget):
                    break
                self._sleep(budget_backoff(attempt))
            else:
                raise TableStorageUnavailableError(
                    f"the budget of pool {pool!r} changed under {self._attempts} attempts to release a slot; "
                    "retry later"
                )
            # Its joins only now: until the reservation is gone they count. (A redelivered release
            # that finds the reservation gone leaves any join a crash left here: it counts for
            # nothing, as its reservation's token is no pool's any more.)
            if joins:
                self._forget_joins(pool, event_key, token)

    def _write_budget(self, row: str, new: _Budget, read: _Budget) -> bool:
        """Write the pool's reservations if its entity is still as `read`; False when another
        invocation wrote it meanwhile (412, or 409 for a create): the caller reads it again."""
        try:
            if read.etag is None:
                self._table.create_entity(new.entity(row))
            elif new.reservations:
                self._table.update_entity(
                    new.entity(row),
                    mode=UpdateMode.REPLACE,
                    etag=read.etag,
                    match_condition=MatchConditions.IfNotModified,
                )
            else:
                self._table.delete_entity(_BUDGET, row, etag=read.etag, match_condition=MatchConditions.IfNotModified)
            return True
        except (ResourceExistsError, ResourceModifiedError, ResourceNotFoundError):
            return False

    def _join(self, pool: str, row: str, event_key: str, budget: _Budget, vms: Sequence[str]) -> bool:
        """Count `vms` with the event's reservation, each in an entity of its own: the VMs of a
        large event join at about the same time, and would conflict on the pool's one entity.

        False when the reservation was let go before the joins were written (read again after
        them): they are taken back, and the caller admits the event afresh, as when it came first.
        Also False when the reservation was admitted alone and another invocation wrote the pool's
        entity before its mark could be taken off: the caller reads it again.
        """
        token = budget.tokens.get(event_key, "")
        new = [vm for vm in vms if vm not in budget.reservations[event_key]]
        if not new:
            return True
        if event_key in budget.alone and not self._write_budget(row, budget.joinable(event_key), budget):
            return False  # its release must look for joins from now on: the mark goes before any join is written
        for vm in new:
            self._table.upsert_entity(_join_entity(pool, event_key, vm, token), mode=UpdateMode.REPLACE)
        after = _Budget.read(self._table, row)
        if event_key in after.reservations and after.tokens.get(event_key, "") == token:
            return True
        for vm in new:
            self._table.delete_entity(_joins_partition(pool), _join_row(event_key, vm))
        return False

    def _with_joins(self, pool: str, budget: _Budget) -> dict[str, list[str]]:
        """The pool's reservations with the VMs that joined each since it was admitted."""
        held = {key: list(vms) for key, vms in budget.reservations.items()}
        for join in self._partition(_joins_partition(pool)):
            key = join["event_key"]
            # A join of a reservation let go (another token) counts for nothing.
            if key in held and join.get("token", "") == budget.tokens.get(key, ""):
                held[key] = joined(held[key], [join["vm"]])
        return held

    def _forget_joins(self, pool: str, event_key: str, token: str) -> None:
        joins = self._table.query_entities(
            "PartitionKey eq @pk and event_key eq @event and token eq @token",
            parameters={"pk": _joins_partition(pool), "event": event_key, "token": token},
            select=["PartitionKey", "RowKey"],
        )
        for join in joins:
            self._table.delete_entity(join["PartitionKey"], join["RowKey"])

    # ---- drains

    def record_drain(self, event_key: str, vm: str, memento: JsonObject) -> None:
        with self._errors("record a drain"):
            self._table.upsert_entity(_drain_entity(event_key, vm, memento), mode=UpdateMode.REPLACE)

    def record_drain_unless(self, event_key: str, vm: str, memento: JsonObject, ended: str) -> bytes | None:
        end = end_rows(ended)
        if end is not None and end.partition == drain_partition(event_key) and not self._earlier_ends.recent():
            with self._errors("record a drain"):
                try:
                    # The record with the VM's mark, which an end writes with its value: created here, it
                    # says no end came before; an end that comes after finds this record (ends.py).
                    self._table.submit_transaction(
                        [
                            ("upsert", _drain_entity(event_key, vm, memento), {"mode": UpdateMode.REPLACE}),
                            ("create", end.mark_entity()),
                        ]
                    )
                    return None
                except TableTransactionError as exc:
                    if not already_exists(exc):
                        raise
        # The mark was there (an end, or an earlier drain of this VM in the event), or the end is kept
        # elsewhere: the record first, then the end (the order `lifecycle.mark_ended` relies on).
        self.record_drain(event_key, vm, memento)
        return self.recall(ended)

    def glance(
        self, recall: Sequence[str], event_key: str = "", vms: Sequence[str] = (), pools: Sequence[str] = ()
    ) -> Glance:
        # The budgets are read by `reserve`, with the ETag its write needs.
        del pools
        ends = {key: end_rows(key) for key in dict.fromkeys(recall)}
        partition = drain_partition(event_key)
        wanted = [escape_key(vm) for vm in dict.fromkeys(vms)] + [end.row for end in ends.values() if end]
        beside = all(end is not None and end.partition == partition for end in ends.values())
        if not vms or not beside or self._earlier_ends.recent():
            return glance_each(self, self, recall, event_key, vms)
        # The VMs' drains and their ends in one query of the event's partition (ends.py).
        with self._errors("read the drains and ends of an event"):
            if len(wanted) <= _MOST_ROWS_IN_A_FILTER:
                rows = {row["RowKey"]: row for row in self._rows(partition, wanted)}
            else:
                rows = {row["RowKey"]: row for row in self._partition(partition)}
        recalled = {
            key: bytes_of(rows[end.row], "value") if end and end.row in rows else None for key, end in ends.items()
        }
        drained = {vm: json.loads(text_of(rows[escape_key(vm)], "memento")) for vm in vms if escape_key(vm) in rows}
        return Glance(recalled, drained)

    def drains(self, event_key: str) -> Mapping[str, JsonObject]:
        with self._errors("read the drains of an event"):
            rows = self._partition(drain_partition(event_key))
            return {row["vm"]: json.loads(text_of(row, "memento")) for row in rows if not is_end_row(row["RowKey"])}

    def forget_drain(self, event_key: str, vm: str) -> None:
        with self._errors("forget a drain"):
            self._table.delete_entity(drain_partition(event_key), escape_key(vm))

    def all_drains(self) -> Sequence[RecordedDrain]:
        # Every drain partition: their keys run from "drain:" to just before "drain;" (';' follows ':').
        with self._errors("read every drain"):
            rows = list(
                self._table.query_entities(
                    "PartitionKey ge @first and PartitionKey lt @after",
                    parameters={"first": "drain:", "after": "drain;"},
                )
            )
        found = [
            # Earlier versions did not write `event_key`: their partition key is it, escaped.
            RecordedDrain(
                row.get("event_key") or unescape_key(row["PartitionKey"].removeprefix("drain:")),
                row["vm"],
                json.loads(text_of(row, "memento")),
            )
            for row in rows
            if not is_end_row(row["RowKey"])
        ]
        return sorted(found, key=lambda drain: (drain.event_key, drain.vm))

    # ---- remembered values and waits

    def remember(self, key: str, value: bytes) -> bytes:
        end = end_rows(key)
        with self._errors("remember a value"):
            if end is not None:
                return self._remember_end(key, end, value)
            entity = {"PartitionKey": _REMEMBERED, "RowKey": escape_key(key), **bytes_properties("value", value)}
            try:
                self._table.create_entity(entity)
                return value
            except ResourceExistsError:
                return bytes_of(self._table.get_entity(_REMEMBERED, escape_key(key)), "value")

    def _remember_end(self, key: str, end: EndRows, value: bytes) -> bytes:
        earlier = self._remembered(key) if self._earlier_ends.recent() else None
        if earlier is not None:
            return earlier  # an earlier version's end came first
        try:
            # The value with the VM's mark: a drain recorded from now on finds the mark (ends.py).
            self._table.submit_transaction(
                [("create", end.entity(bytes_properties("value", value))), ("upsert", end.mark_entity())]
            )
            return value
        except TableTransactionError as exc:
            if not already_exists(exc):
                raise
        return bytes_of(self._table.get_entity(end.partition, end.row), "value")

    def recall(self, key: str) -> bytes | None:
        end = end_rows(key)
        with self._errors("recall a value"):
            if end is None:
                return self._remembered(key)
            try:
                return bytes_of(self._table.get_entity(end.partition, end.row), "value")
            except ResourceNotFoundError:
                return self._remembered(key) if self._earlier_ends.recent() else None

    def _remembered(self, key: str) -> bytes | None:
        try:
            return bytes_of(self._table.get_entity(_REMEMBERED, escape_key(key)), "value")
        except ResourceNotFoundError:
            return None

    def park(self, pool: str, event_key: str, envelope: bytes, now: datetime) -> None:
        entity = {
            "PartitionKey": _parked_partition(pool),
            "RowKey": escape_key(event_key),
            "event_key": event_key,
            "parked_at": now.timestamp(),
        }
        pieces = bytes_properties("envelope", envelope)
        with self._errors("park an event"):
            try:
                self._table.create_entity({**entity, **pieces})
            except ResourceExistsError:
                # A later step of a waiting event replaces its envelope but keeps its place in line.
                # (Pieces of a longer envelope may stay behind: `envelope_pieces` says how many count.)
                update = {"PartitionKey": entity["PartitionKey"], "RowKey": entity["RowKey"], **pieces}
                self._table.update_entity(update, mode=UpdateMode.MERGE)

    def parked(self, pool: str) -> Sequence[Parked]:
        with self._errors("read the waiting events"):
            rows = self._partition(_parked_partition(pool))
        return in_line(
            Parked(row["event_key"], bytes_of(row, "envelope"), datetime.fromtimestamp(row["parked_at"], timezone.utc))
            for row in rows
        )

    def unpark(self, pool: str, event_key: str) -> None:
        with self._errors("unpark an event"):
            self._table.delete_entity(_parked_partition(pool), escape_key(event_key))

    # ---- helpers

    def _replace(self, entity: Mapping[str, Any], current: TableEntity) -> None:
        self._table.update_entity(
            dict(entity),
            mode=UpdateMode.REPLACE,
            etag=current.metadata["etag"],
            match_condition=MatchConditions.IfNotModified,
        )

    def _partition(self, partition: str) -> list[TableEntity]:
        return list(self._table.query_entities("PartitionKey eq @pk", parameters={"pk": partition}))

    def _rows(self, partition: str, rows: Sequence[str]) -> list[TableEntity]:
        """The rows of `partition` among `rows` (at most `_MOST_ROWS_IN_A_FILTER`), in one query. (The
        SDK takes a parameter's name up to the next space: a bracket needs one before it.)"""
        either = " or ".join(f"RowKey eq @r{index}" for index in range(len(rows)))
        parameters = {"pk": partition, **{f"r{index}": row for index, row in enumerate(rows)}}
        return list(self._table.query_entities(f"PartitionKey eq @pk and ( {either} )", parameters=parameters))

    def _errors(self, action: str) -> AbstractContextManager[None]:
        return table_errors(self._table.table_name, action)


def _drain_entity(event_key: str, vm: str, memento: JsonObject) -> dict[str, Any]:
    return {
        "PartitionKey": drain_partition(event_key),
        "RowKey": escape_key(vm),
        "event_key": event_key,
        "vm": vm,
        **text_properties("memento", json.dumps(memento, sort_keys=True)),
    }


def _parked_partition(pool: str) -> str:
    return f"parked:{escape_key(pool)}"


def _joins_partition(pool: str) -> str:
    return f"joins:{escape_key(pool)}"


def _join_row(event_key: str, vm: str) -> str:
    return escape_key(json.dumps([event_key, vm]))


def _join_entity(pool: str, event_key: str, vm: str, token: str) -> dict[str, Any]:
    return {
        "PartitionKey": _joins_partition(pool),
        "RowKey": _join_row(event_key, vm),
        "event_key": event_key,
        "vm": vm,
        "token": token,
    }


@dataclass(frozen=True)
class _Budget:
    """A pool's budget entity as read: event key → the VMs it was admitted with, the token of each
    admission (which its joins carry, so a join of an admission let go never counts for a later one of
    the same event), and its terms: [admitted_at, expires_at], seconds since the epoch. Entities written
    before tokens have none: their token is ""; before terms, none: see `swept`."""

    reservations: dict[str, list[str]]
    tokens: dict[str, str]
    terms: dict[str, list[float | None]]
    # Events admitted alone (`StateStore.reserve`) that no VM joined: their release looks for no joins.
    # Entities written before this have none.
    alone: frozenset[str] = frozenset()
    etag: str | None = field(default=None, compare=False)  # None: no entity

    @classmethod
    def read(cls, table: TableClient, row: str) -> _Budget:
        try:
            entity = table.get_entity(_BUDGET, row)
        except ResourceNotFoundError:
            return cls({}, {}, {}, frozenset(), None)
        tokens = json.loads(entity["tokens"]) if entity.get("tokens") else {}
        terms = json.loads(text_of(entity, "terms")) if entity.get("terms") else {}
        alone = frozenset(json.loads(text_of(entity, "alone"))) if entity.get("alone") else frozenset()
        return cls(json.loads(text_of(entity, "reservations")), tokens, terms, alone, entity.metadata["etag"])

    def swept(self, now: datetime) -> tuple[_Budget, tuple[Reservation, ...]]:
        """The budget without the reservations expired at `now` (returned), and with an expiry for
        those an earlier version wrote without one (`legacy_expiry`)."""
        terms: dict[str, list[float | None]] = {}
        expired: list[Reservation] = []
        for key, vms in self.reservations.items():
            admitted_at, expires_at = self.terms.get(key) or [None, None]
            if expires_at is None:
                expires_at = legacy_expiry(now).timestamp()
            if has_expired(_moment(expires_at), now):
                expired.append(Reservation(key, tuple(vms), _moment(admitted_at), _moment(expires_at)))
            else:
                terms[key] = [admitted_at, expires_at]
        reservations = {key: vms for key, vms in self.reservations.items() if key in terms}
        tokens = {key: token for key, token in self.tokens.items() if key in terms}
        return _Budget(reservations, tokens, terms, self.alone.intersection(terms), self.etag), tuple(expired)

    def admitting(
        self, event_key: str, vms: Sequence[str], now: datetime, expires_at: datetime, *, alone: bool = False
    ) -> _Budget:
        tokens = {**self.tokens, event_key: uuid.uuid4().hex}
        term: list[float | None] = [now.timestamp(), expires_at.timestamp()]
        terms = {**self.terms, event_key: term}
        marked = self.alone | {event_key} if alone else self.alone - {event_key}
        return _Budget({**self.reservations, event_key: list(vms)}, tokens, terms, marked, self.etag)

    def releasing(self, event_key: str) -> _Budget:
        reservations = {key: vms for key, vms in self.reservations.items() if key != event_key}
        tokens = {key: token for key, token in self.tokens.items() if key in reservations}
        terms = {key: term for key, term in self.terms.items() if key in reservations}
        return _Budget(reservations, tokens, terms, self.alone - {event_key}, self.etag)

    def joinable(self, event_key: str) -> _Budget:
        """The same reservations, the event's no longer marked as admitted alone."""
        return _Budget(self.reservations, self.tokens, self.terms, self.alone - {event_key}, self.etag)

    def text(self) -> str:
        """What the entity holds, as the text its properties take."""
        held = (self.reservations, self.tokens, self.terms, sorted(self.alone))
        return "".join(json.dumps(part) for part in held)

    def entity(self, row: str) -> dict[str, Any]:
        return {
            "PartitionKey": _BUDGET,
            "RowKey": row,
            **text_properties("reservations", json.dumps(self.reservations)),
            "tokens": json.dumps(self.tokens),
            **text_properties("terms", json.dumps(self.terms)),
            **text_properties("alone", json.dumps(sorted(self.alone))),
        }


@overload
def _moment(stamp: float) -> datetime: ...


@overload
def _moment(stamp: None) -> None: ...


def _moment(stamp: float | None) -> datetime | None:
    return None if stamp is None else datetime.fromtimestamp(stamp, timezone.utc)
