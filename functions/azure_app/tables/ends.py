"""Where Table Storage keeps an event's end for one VM: beside the event's drains.

An end (`functions.core.keys.ended_key`) lives in the event's drain partition, ``drain:<event key>``,
as two rows per VM:

- ``%end:<VM>``, the end's value, created once (the first end processed wins, as `remember` says);
- ``%mark:<VM>``, a row without properties that the end writes with its value in one transaction
  and that a drain recorded by `record_drain_unless` creates with its record in one transaction.
  The drain's transaction fails when the mark is there, so a drain and an end can never both miss
  each other: the race `functions.core.lifecycle.mark_ended` is about is closed in one request.

Beside the drains, a step reads its end and its drain records in one query (`glance`) and records
a drain with its end check in one transaction. The rows' keys start with '%' and a lowercase
letter, which no escaped key does (`escape_key` writes '%' only before two upper-case hex digits or
'~'), so they never meet a VM's drain row.

Versions before this kept ends in the ``remembered`` partition (rows ``ended|<event key>|<VM>``).
`EarlierEnds` tells whether any such row was written in the last `EARLIER_ENDS_LOOKBACK` (longer
than a message lives on the events topic, 14 days): while one was, ends are also looked for there
and drains recorded in two requests, the record then the end, as those versions did.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from azure.data.tables import TableClient, TableTransactionError

from functions.azure_app.tables.entities import escape_key
from functions.core.keys import ended_subject

REMEMBERED = "remembered"
END_ROW, MARK_ROW = "%end:", "%mark:"
EARLIER_ENDS_LOOKBACK = timedelta(days=15)  # a message lives 14 days on the events topic (infra/)
EARLIER_ENDS_RECHECK_SECONDS = 600.0
_QUIET_CHECKS_TO_SETTLE = 2  # found none twice, RECHECK apart: no earlier version writes any more


def drain_partition(event_key: str) -> str:
    return f"drain:{escape_key(event_key)}"


@dataclass(frozen=True)
class EndRows:
    """The rows of one VM's end of one event."""

    partition: str
    row: str  # the end's value
    mark: str  # an end or a drain was here

    def entity(self, properties: dict[str, object]) -> dict[str, object]:
        return {"PartitionKey": self.partition, "RowKey": self.row, **properties}

    def mark_entity(self) -> dict[str, object]:
        return {"PartitionKey": self.partition, "RowKey": self.mark}


def end_rows(key: str) -> EndRows | None:
    """The rows of the end remembered under `key`, or None when `key` is not an end."""
    subject = ended_subject(key)
    if subject is None:
        return None
    event_key, vm = subject
    return EndRows(drain_partition(event_key), END_ROW + escape_key(vm), MARK_ROW + escape_key(vm))


def is_end_row(row_key: str) -> bool:
    """Whether a row of a drain partition belongs to an end, not to a VM's drain."""
    return row_key.startswith((END_ROW, MARK_ROW))


def already_exists(error: TableTransactionError) -> bool:
    """Whether a transaction failed because a row it creates is there (409), not for another reason."""
    return error.status_code == 409


class EarlierEnds:
    """Whether an earlier version remembered an end lately (see the module docstring).

    Asked once per `EARLIER_ENDS_RECHECK_SECONDS` at most, by one query of the ``ended|`` rows of
    the ``remembered`` partition written since the lookback; settled as none for the life of the
    process once two checks, a recheck apart, found none.
    """

    def __init__(self, table: TableClient, now: Callable[[], datetime], monotonic: Callable[[], float]) -> None:
        self._table = table
        self._now = now
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._checked_at: float | None = None
        self._recent = True
        self._quiet_checks = 0

    def recent(self) -> bool:
        with self._lock:
            if self._quiet_checks >= _QUIET_CHECKS_TO_SETTLE:
                return False
            at = self._monotonic()
            if self._checked_at is not None and at - self._checked_at < EARLIER_ENDS_RECHECK_SECONDS:
                return self._recent
            self._recent = self._any_since(self._now() - EARLIER_ENDS_LOOKBACK)
            self._checked_at = at
            self._quiet_checks = 0 if self._recent else self._quiet_checks + 1
            return self._recent

    def _any_since(self, since: datetime) -> bool:
        rows = self._table.query_entities(
            "PartitionKey eq @pk and RowKey ge @first and RowKey lt @after and Timestamp ge @since",
            # '}' follows '|': the range holds every key that starts with "ended|"
            parameters={"pk": REMEMBERED, "first": "ended|", "after": "ended}", "since": since},
            results_per_page=1,
            select=["RowKey"],
        )
        return next(iter(rows), None) is not None
