"""StateStore and AuditLog on Azure Table Storage (azure-data-tables); same contract as the SQLite store.

Layout: two tables.

The state table (default `mbridgestate`) keeps each concern in its own partitions:

=====================  ==========================  ==============  ==========================================
concern                PartitionKey                RowKey          properties
=====================  ==========================  ==============  ==========================================
idempotency claims     ``claims``                  envelope id     state, lease_until, updated_at (epoch s)
budget of a pool       ``budget``                  pool            reservations: JSON {event key: [VMs]}
drains of an event     ``drain:<event key>``       VM              vm, memento (JSON)
remembered values      ``remembered``              key             value (binary): command bytes, event ends
waits for the budget   ``parked:<pool>``           event key       event_key, envelope (binary), parked_at
=====================  ==========================  ==============  ==========================================

Atomicity comes from ETags, never from locks: a claim is created once (409 on a duplicate) and
taken over only with If-Match on the expired lease; a pool's reservations live in ONE entity
updated read-modify-write with If-Match, so two invocations can never both take the last slot
(the loser's write fails with 412, it re-reads and sees the pool full).

The audit table (default `mbridgeaudit`): PartitionKey = VM name, RowKey = inverted write time
in nanoseconds + a uuid, so a partition lists a VM's records newest first (the portal and
`$top` show the latest). `TableAuditLog.query` returns records oldest first, in write order, like
the SQLite log. `event_id_lower` makes the event query case-insensitive (Azure EventIds are
upper case in IMDS and lower case in envelope ids).

Keys are escaped: '/', '\\', '#', '?' are not allowed in Table keys, nor are control characters;
they and the escape character '%' are written as %XX. Values stay readable in properties. A key
holds at most 1 KiB: a longer one (an audit record naming many VMs) keeps its first 200
characters and the SHA-256 of the whole, after `%~`, which no escaped value contains.

Sizes: a property holds at most 64 KiB (text: 32K UTF-16 characters), an entity 1 MiB. A value
whose size comes from the input — a pool's reservations, a memento, a remembered value, an
envelope waiting for the budget — is written as it always was when it fits one property, and
otherwise as its UTF-8 bytes in pieces of 64 KiB: `<name>`, `<name>_1`, ... (`<name>_pieces`
counts them), at most 640 KiB in all. A pool whose reservations would outgrow that admits no
further event until one lets its slot go: the event waits, as for a budget. Audit records are
small by construction (`AuditRecord` cuts its texts). Nothing expires by itself: claims,
remembered commands and audit rows accumulate like in the SQLite store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableEntity, UpdateMode

from functions.core.audit_codec import EVENT_ID_LOWER, audit_fields, audit_record, event_id_lower
from functions.core.ports import AuditRecord, Claim, JsonObject, Parked
from functions.core.store_rules import DONE, IN_PROGRESS, admits, claim_found, in_line, joined
from wire.errors import PermanentError, RetryableError

LOGGER = logging.getLogger("mbridge.functions.azure.tables")

TABLE_ROLE = "Storage Table Data Contributor"
# Read-modify-write attempts on one budget entity before giving up to a redelivery.
BUDGET_ATTEMPTS = 8
_MAX_NS = 10**20 - 1  # 20 digits: nanoseconds since 1970 until the year 5138

_CLAIMS, _BUDGET, _REMEMBERED = "claims", "budget", "remembered"


# An escaped key longer than this (in UTF-16 units) is shortened, leaving room under Table
# Storage's 1 KiB (512 units) for a partition's prefix such as "parked:".
_LONGEST_KEY = 480
_SHORTENED_KEY_PREFIX = 200  # characters: at most 400 units


def escape_key(value: str) -> str:
    """A Table Storage key for `value`: distinct values give distinct keys."""
    key = "".join(f"%{ord(c):02X}" if _needs_escape(c) else c for c in value)
    if _utf16_units(key) <= _LONGEST_KEY:
        return key
    return f"{key[:_SHORTENED_KEY_PREFIX]}%~{hashlib.sha256(value.encode('utf-8', 'surrogatepass')).hexdigest()}"


def _utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _needs_escape(character: str) -> bool:
    code = ord(character)
    return character in "%/\\#?" or code < 0x20 or 0x7F <= code <= 0x9F


class TableStorageUnavailableError(RetryableError):
    """Table Storage throttled, failed or could not be reached; the message is redelivered."""


class TableStorageConfigError(PermanentError):
    """The table is missing or the app's identity may not use it; fix the deployment."""


class TableValueTooLargeError(PermanentError):
    """A value larger than one entity can hold, even in pieces."""


# One property holds 64 KiB of binary, or text of 32K UTF-16 units.
_PROPERTY_BYTES = 64 * 1024
# The pieces of one value; with its other properties the entity stays well under 1 MiB (Azurite
# counts binary as the base64 text of the request: 640 KiB is 853 KiB there).
_MOST_PIECES = 10


def _text_properties(name: str, text: str) -> dict[str, Any]:
    """The properties that hold `text` under `name`: one string property when it fits (as every
    version before wrote it), else its UTF-8 bytes in pieces.

    Raises:
        TableValueTooLargeError: more than an entity can hold.
    """
    if 2 * _utf16_units(text) <= _PROPERTY_BYTES:
        return {name: text, f"{name}_pieces": 1}
    return _bytes_properties(name, text.encode("utf-8", "surrogatepass"))


def _bytes_properties(name: str, data: bytes) -> dict[str, Any]:
    """The properties that hold `data` under `name`: `name`, `name_1`, ... and their count.

    Raises:
        TableValueTooLargeError: more than an entity can hold.
    """
    pieces = [data[start : start + _PROPERTY_BYTES] for start in range(0, len(data), _PROPERTY_BYTES)] or [b""]
    if len(pieces) > _MOST_PIECES:
        raise TableValueTooLargeError(
            f"{name} is {len(data)} bytes; an entity holds at most {_MOST_PIECES * _PROPERTY_BYTES} of it"
        )
    properties: dict[str, Any] = {_piece_name(name, index): piece for index, piece in enumerate(pieces)}
    properties[f"{name}_pieces"] = len(pieces)
    return properties


def _text_of(entity: Mapping[str, Any], name: str) -> str:
    """What `_text_properties` wrote (or a plain string property an earlier version wrote)."""
    value = entity[name]
    if isinstance(value, str):
        return value
    return _bytes_of(entity, name).decode("utf-8", "surrogatepass")


def _bytes_of(entity: Mapping[str, Any], name: str) -> bytes:
    """What `_bytes_properties` wrote (or a single binary property an earlier version wrote)."""
    count = int(entity.get(f"{name}_pieces", 1))
    return b"".join(bytes(entity[_piece_name(name, index)]) for index in range(count))


def _piece_name(name: str, index: int) -> str:
    return name if index == 0 else f"{name}_{index}"


def _fits_in_an_entity(text: str) -> bool:
    return len(text.encode("utf-8", "surrogatepass")) <= _MOST_PIECES * _PROPERTY_BYTES


@contextmanager
def table_errors(table: str, action: str) -> Iterator[None]:
    """Map what azure-data-tables raises to our errors, naming the table and what to do."""
    try:
        yield
    except ClientAuthenticationError as exc:
        raise TableStorageConfigError(
            f"cannot {action} in table {table!r}: authentication failed; the function app needs a managed "
            f"identity (AZURE_CLIENT_ID selects a user-assigned one) or a valid connection string: {exc.message}"
        ) from exc
    except HttpResponseError as exc:
        status = exc.status_code or 0
        if status == 403:
            raise TableStorageConfigError(
                f"not authorised to {action} in table {table!r}: grant the function app's identity the role "
                f"{TABLE_ROLE!r} on the storage account: {exc.message}"
            ) from exc
        if status == 404:
            raise TableStorageConfigError(
                f"table {table!r} does not exist: deploy it (infra/) or fix MBRIDGE_STATE_TABLE / "
                f"MBRIDGE_AUDIT_TABLE: {exc.message}"
            ) from exc
        if status in (408, 429) or status >= 500:
            raise TableStorageUnavailableError(f"cannot {action} in table {table!r} now: {exc.message}") from exc
        raise TableStorageConfigError(f"table {table!r} refused to {action} (HTTP {status}): {exc.message}") from exc
    except AzureError as exc:  # connection and timeout errors: no HTTP response at all
        raise TableStorageUnavailableError(f"cannot reach table {table!r} to {action}: {exc}") from exc


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
                if not _fits_in_an_entity(json.dumps({**reservations, event_key: grown})):
                    # Admitted with its event, but the pool's one entity cannot count it too.
                    LOGGER.warning("the reservations of pool %s fill their entity: %s is not counted", pool, vms)
                    return True
                reservations[event_key] = grown
                return None
            if not admits(reservations.values(), vms, limit):
                return False
            if reservations and not _fits_in_an_entity(json.dumps({**reservations, event_key: list(vms)})):
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
                reservations: dict[str, list[str]] = json.loads(_text_of(current, "reservations")) if current else {}
                answer = change(reservations)
                if answer is not None:
                    return answer
                entity = {
                    "PartitionKey": _BUDGET,
                    "RowKey": row,
                    **_text_properties("reservations", json.dumps(reservations)),
                }
                try:
                    if current is None:
                        self._table.create_entity(entity)
                    else:
                        self._replace(entity, current)
                    return True
                except (ResourceExistsError, ResourceModifiedError):
                    # Someone wrote the pool between our read and write; back off a little, with
                    # jitter so that racing invocations do not collide again in step.
                    self._sleep(random.uniform(0.01, 0.05) * (attempt + 1))
        raise TableStorageUnavailableError(
            f"the budget of pool {pool!r} changed under {self._attempts} attempts to {action}; retry later"
        )

    # ---- drains

    def record_drain(self, event_key: str, vm: str, memento: JsonObject) -> None:
        entity = {
            "PartitionKey": _drain_partition(event_key),
            "RowKey": escape_key(vm),
            "vm": vm,
            **_text_properties("memento", json.dumps(memento, sort_keys=True)),
        }
        with self._errors("record a drain"):
            self._table.upsert_entity(entity, mode=UpdateMode.REPLACE)

    def drains(self, event_key: str) -> Mapping[str, JsonObject]:
        with self._errors("read the drains of an event"):
            rows = self._partition(_drain_partition(event_key))
            return {row["vm"]: json.loads(_text_of(row, "memento")) for row in rows}

    def forget_drain(self, event_key: str, vm: str) -> None:
        with self._errors("forget a drain"):
            self._table.delete_entity(_drain_partition(event_key), escape_key(vm))

    # ---- remembered values and waits

    def remember(self, key: str, value: bytes) -> bytes:
        entity = {"PartitionKey": _REMEMBERED, "RowKey": escape_key(key), **_bytes_properties("value", value)}
        with self._errors("remember a value"):
            try:
                self._table.create_entity(entity)
                return value
            except ResourceExistsError:
                return _bytes_of(self._table.get_entity(_REMEMBERED, escape_key(key)), "value")

    def recall(self, key: str) -> bytes | None:
        with self._errors("recall a value"):
            try:
                return _bytes_of(self._table.get_entity(_REMEMBERED, escape_key(key)), "value")
            except ResourceNotFoundError:
                return None

    def park(self, pool: str, event_key: str, envelope: bytes, now: datetime) -> None:
        entity = {
            "PartitionKey": _parked_partition(pool),
            "RowKey": escape_key(event_key),
            "event_key": event_key,
            "parked_at": now.timestamp(),
        }
        pieces = _bytes_properties("envelope", envelope)
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
            Parked(row["event_key"], _bytes_of(row, "envelope"), datetime.fromtimestamp(row["parked_at"], timezone.utc))
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


class TableAuditLog:
    """AuditLog over one table: append-only, one partition per VM (see the module docstring)."""

    def __init__(self, table: TableClient, *, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._table = table
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._last_ns = 0

    def append(self, record: AuditRecord) -> None:
        written_ns = self._next_ns()
        entity = {
            "PartitionKey": escape_key(record.vm),
            "RowKey": f"{_MAX_NS - written_ns:020d}-{uuid.uuid4().hex}",
            "written_ns": str(written_ns),  # as text: Edm.Int64 would come back wrapped
            **audit_fields(record),
            EVENT_ID_LOWER: event_id_lower(record.event_id),
        }
        with table_errors(self._table.table_name, "append an audit record"):
            self._table.create_entity(entity)

    def query(self, *, vm: str | None = None, event_id: str | None = None) -> Sequence[AuditRecord]:
        clauses: list[str] = []
        parameters: dict[str, str] = {}
        if vm is not None:
            clauses.append("PartitionKey eq @vm")
            parameters["vm"] = escape_key(vm)
        if event_id is not None:
            clauses.append(f"{EVENT_ID_LOWER} eq @event")
            parameters["event"] = event_id_lower(event_id)
        with table_errors(self._table.table_name, "query the audit log"):
            if clauses:
                rows = list(self._table.query_entities(" and ".join(clauses), parameters=parameters))
            else:
                rows = list(self._table.list_entities())
        # Oldest first, in write order, whatever partitions the rows came from.
        rows.sort(key=lambda row: int(row["written_ns"]))
        return [audit_record(row) for row in rows]

    def _next_ns(self) -> int:
        """The write time, strictly increasing within this process: records appended by one
        invocation keep their order even when the clock does not move between them."""
        with self._lock:
            self._last_ns = max(self._clock_ns(), self._last_ns + 1)
            return self._last_ns
