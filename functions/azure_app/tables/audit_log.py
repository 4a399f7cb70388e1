"""The AuditLog port over one table: one partition per VM, rows newest first, read back oldest first."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from azure.data.tables import TableClient

from functions.azure_app.tables.entities import escape_key
from functions.azure_app.tables.errors import table_errors
from functions.core.audit_codec import EVENT_ID_LOWER, audit_fields, audit_record, event_id_lower, names
from functions.core.ports import AuditRecord, Finishing
from wire.timefmt import format_rfc3339, parse_rfc3339

_MAX_NS = 10**20 - 1  # 20 digits: nanoseconds since 1970 until the year 5138
_MOST_PER_TRANSACTION = 100  # operations in one entity group transaction


class TableAuditLog:
    """AuditLog over one table: append-only, one partition per VM (see the module docstring)."""

    def __init__(self, table: TableClient, *, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._table = table
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._last_ns = 0

    def append(self, record: AuditRecord) -> None:
        self.append_all([record])

    def append_all(self, records: Sequence[AuditRecord], then: Finishing | None = None) -> None:
        """One entity group transaction per VM's partition (at most 100 rows each), in the order of
        the records: the records of one message are one request when they are about one VM."""
        batches: list[list[dict[str, Any]]] = []
        for record in records:
            entity = self._entity(record)
            last = batches[-1] if batches else None
            if last and last[0]["PartitionKey"] == entity["PartitionKey"] and len(last) < _MOST_PER_TRANSACTION:
                last.append(entity)
            else:
                batches.append([entity])
        with table_errors(self._table.table_name, "append audit records"):
            for batch in batches:
                if len(batch) == 1:
                    self._table.create_entity(batch[0])
                else:
                    self._table.submit_transaction([("create", entity) for entity in batch])
        if then is not None:
            then.write()

    def _entity(self, record: AuditRecord) -> dict[str, Any]:
        written_ns = self._next_ns()
        return {
            "PartitionKey": escape_key(record.vm),
            "RowKey": f"{_MAX_NS - written_ns:020d}-{uuid.uuid4().hex}",
            "written_ns": str(written_ns),  # as text: Edm.Int64 would come back wrapped
            **audit_fields(record),
            EVENT_ID_LOWER: event_id_lower(record.event_id),
        }

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

    def query_naming(self, vm: str, *, event_id: str | None = None) -> Sequence[AuditRecord]:
        """The records that name `vm` (audit_codec.names), of one event or all, oldest first.

        A record names VMs inside its `detail`, where Table Storage cannot look: this reads the whole
        table (one request per 1,000 records), or the records of the event given (the service scans
        the table for them, as `query` by event does), and keeps those that name the VM. The VM's own
        partition alone is `query(vm=...)`."""
        return [record for record in self.query(event_id=event_id) if names(record, vm)]

    def query_trace(self, trace_id: str) -> Sequence[AuditRecord]:
        """The records of one trace, oldest first (`mbridge audit list --trace`). Table Storage has no
        index on `trace_id`: the service scans the whole table, as for `query` by event, and returns
        only the trace's records (a few dozen: one maintenance of one VM)."""
        with table_errors(self._table.table_name, "query the audit log"):
            rows = list(self._table.query_entities("trace_id eq @trace", parameters={"trace": trace_id}))
        rows.sort(key=lambda row: int(row["written_ns"]))
        return [audit_record(row) for row in rows]

    def query_since(self, since: datetime, *, most: int, vm: str | None = None) -> Sequence[AuditRecord]:
        """The records from `since` on (by their `time`), oldest first, at most `most` of them: a view of
        the whole log that reads only what it shows (`mbridge fleet`).

        Table Storage has no index on a property: the service scans the table (a VM's partition with
        `vm`) and returns only what matches, `most` at most. `time` is RFC 3339 text with milliseconds
        only when there are any, which does not sort as text within a second; the service is asked for
        the records from the start of `since`'s second (a prefix sorts before every time of that
        second) and the few of that second before `since` are left out here."""
        second = format_rfc3339(since.replace(microsecond=0))[:-1]  # without its "Z": a prefix of the second
        clauses, parameters = ["time ge @since"], {"since": second}
        if vm is not None:
            clauses.append("PartitionKey eq @vm")
            parameters["vm"] = escape_key(vm)
        rows: list[dict[str, Any]] = []
        with table_errors(self._table.table_name, "query the audit log"):
            pages = self._table.query_entities(
                " and ".join(clauses), parameters=parameters, results_per_page=max(1, min(most, 1000))
            )
            for row in pages:
                if len(rows) >= most:
                    break
                if parse_rfc3339(row["time"]) >= since:
                    rows.append(row)
        rows.sort(key=lambda row: int(row["written_ns"]))
        return [audit_record(row) for row in rows]

    def _next_ns(self) -> int:
        """The write time, strictly increasing within this process: records appended by one
        invocation keep their order even when the clock does not move between them."""
        with self._lock:
            self._last_ns = max(self._clock_ns(), self._last_ns + 1)
            return self._last_ns
