"""The StateStore port over one table: claims, budgets, drains, remembered values and waits, each in
partitions of their own, made atomic with ETags (see the package docstring for the layout)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableEntity, UpdateMode

from functions.azure_app.tables.entities import (
    bytes_of,
    bytes_properties,
    escape_key,
    fits_in_an_entity,
    text_of,
    text_properties,
)
from functions.azure_app.tables.errors import TableStorageUnavailableError, table_errors
from functions.core.ports import Claim, JsonObject, Parked
from functions.core.store_rules import (
    BUDGET_ATTEMPTS,
    DONE,
    IN_PROGRESS,
    admits,
    budget_backoff,
    claim_found,
    in_line,
    joined,
)

LOGGER = logging.getLogger("mbridge.functions.azure.tables")

_CLAIMS, _BUDGET, _REMEMBERED = "claims", "budget", "remembered"


class TableStateStore:
    """StateStore over one table (see the module docstring for the layout)."""

    def __init__(
        self,
        table: TableClient,
        *,
        attempts: int = BUDGET_ATTEMPTS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._table = table
        self._attempts = attempts
        self._sleep = sleep

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

    def reserve(self, pool: str, event_key: str, vms: Sequence[str], limit: int | None) -> bool:
        def admit(reservations: dict[str, list[str]]) -> bool | None:
            if event_key in reservations:
                # Admitted already: another VM of the event joins it (each VM's own report drains it).
                held = reservations[event_key]
                grown = joined(held, vms)
                if grown == held:
                    return True  # nothing to write
                if not fits_in_an_entity(json.dumps({**reservations, event_key: grown})):
                    # Admitted with its event, but the pool's one entity cannot count it too.
                    LOGGER.warning("the reservations of pool %s fill their entity: %s is not counted", pool, vms)
                    return True
                reservations[event_key] = grown
                return None
            if not admits(reservations.values(), vms, limit):
                return False
            if reservations and not fits_in_an_entity(json.dumps({**reservations, event_key: list(vms)})):
                # The pool's one entity is full: the event waits for a slot as for a budget (an
                # event alone always fits: at most 1,000 VMs of 80 characters).
                LOGGER.warning("the reservations of pool %s fill their entity: %s waits for a slot", pool, event_key)
                return False
            reservations[event_key] = list(vms)
            return None  # changed: write it

        return self._update_budget(pool, admit, "reserve a budget slot")

    def release(self, pool: str, event_key: str) -> None:
        def drop(reservations: dict[str, list[str]]) -> bool | None:
            if reservations.pop(event_key, None) is None:
                return True  # nothing to write
            return None

        self._update_budget(pool, drop, "release a budget slot")

    def _update_budget(self, pool: str, change: Callable[[dict[str, list[str]]], bool | None], action: str) -> bool:
        """Read the pool's reservations, apply `change`, write them back if it returned None.

        The write carries the ETag of the read: a concurrent writer makes it fail (412), and the
        change is applied again to what that writer left.
        """
        row = escape_key(pool)
        with self._errors(action):
            for attempt in range(self._attempts):
                try:
                    current: TableEntity | None = self._table.get_entity(_BUDGET, row)
                except ResourceNotFoundError:
                    current = None
                reservations: dict[str, list[str]] = json.loads(text_of(current, "reservations")) if current else {}
                answer = change(reservations)
                if answer is not None:
                    return answer
                entity = {
                    "PartitionKey": _BUDGET,
                    "RowKey": row,
                    **text_properties("reservations", json.dumps(reservations)),
                }
                try:
                    if current is None:
                        self._table.create_entity(entity)
                    else:
                        self._replace(entity, current)
                    return True
                except (ResourceExistsError, ResourceModifiedError):
                    # Someone wrote the pool between our read and write: read it again shortly.
                    self._sleep(budget_backoff(attempt))
        raise TableStorageUnavailableError(
            f"the budget of pool {pool!r} changed under {self._attempts} attempts to {action}; retry later"
        )

    # ---- drains

    def record_drain(self, event_key: str, vm: str, memento: JsonObject) -> None:
        entity = {
            "PartitionKey": _drain_partition(event_key),
            "RowKey": escape_key(vm),
            "vm": vm,
            **text_properties("memento", json.dumps(memento, sort_keys=True)),
        }
        with self._errors("record a drain"):
            self._table.upsert_entity(entity, mode=UpdateMode.REPLACE)

    def drains(self, event_key: str) -> Mapping[str, JsonObject]:
        with self._errors("read the drains of an event"):
            rows = self._partition(_drain_partition(event_key))
            return {row["vm"]: json.loads(text_of(row, "memento")) for row in rows}

    def forget_drain(self, event_key: str, vm: str) -> None:
        with self._errors("forget a drain"):
            self._table.delete_entity(_drain_partition(event_key), escape_key(vm))

    # ---- remembered values and waits

    def remember(self, key: str, value: bytes) -> bytes:
        entity = {"PartitionKey": _REMEMBERED, "RowKey": escape_key(key), **bytes_properties("value", value)}
        with self._errors("remember a value"):
            try:
                self._table.create_entity(entity)
                return value
            except ResourceExistsError:
                return bytes_of(self._table.get_entity(_REMEMBERED, escape_key(key)), "value")

    def recall(self, key: str) -> bytes | None:
        with self._errors("recall a value"):
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

    def _errors(self, action: str) -> AbstractContextManager[None]:
        return table_errors(self._table.table_name, action)


def _drain_partition(event_key: str) -> str:
    return f"drain:{escape_key(event_key)}"


def _parked_partition(pool: str) -> str:
    return f"parked:{escape_key(pool)}"
