"""An event's end for one VM beside the event's drains on Table Storage, against Azurite
(functions/azure_app/tables/ends.py): one query reads a step's end and drains, one transaction
records a drain and checks the end, and ends an earlier version kept in the ``remembered`` partition
still count while they may matter.

What every store does with ends and drains is the shared suite (tests/contract/test_state_store.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from azure.data.tables import TableClient, TableServiceClient

from bench.store_counting import RoundTrips, table_hook
from functions.azure_app.tables import TableStateStore, escape_key
from functions.azure_app.tables.ends import EARLIER_ENDS_LOOKBACK, EARLIER_ENDS_RECHECK_SECONDS
from tests.kit.clock import FakeClock

pytestmark = pytest.mark.peer

EVENT = "azure:e-1"
ENDED = f"ended|{EVENT}|web-0"  # functions.core.keys.ended_key of web-0's part
COMPLETED = json.dumps({"status": "completed"}).encode()
MEMENTO = {"pool": "web", "state": "removed"}


class Table:
    """A fresh state table on Azurite, its requests counted, and a store on it with a fake clock."""

    def __init__(self, connection_string: str) -> None:
        self.counter = RoundTrips()
        self.service = TableServiceClient.from_connection_string(
            connection_string, raw_response_hook=table_hook(self.counter)
        )
        self.name = f"t{uuid.uuid4().hex[:16]}"
        self.client: TableClient = self.service.create_table(self.name)
        # Its wall clock starts at the real time: the table stamps rows with Azurite's.
        self.clock = FakeClock(start=datetime.now(timezone.utc))

    def store(self) -> TableStateStore:
        return TableStateStore(self.client, now=self.clock.now, monotonic=self.clock.monotonic)

    def requests(self) -> int:
        return sum(self.counter.trips.values())

    def write_end_as_earlier_versions(self, key: str, value: bytes) -> None:
        """An end where versions before this one kept it: the `remembered` partition."""
        self.client.create_entity({"PartitionKey": "remembered", "RowKey": escape_key(key), "value": value})


@pytest.fixture
def table(azurite_tables: str) -> Iterator[Table]:
    made = Table(azurite_tables)
    yield made
    made.service.close()


def test_a_drain_recorded_before_its_end_is_one_request_and_the_end_finds_it(table: Table) -> None:
    # GIVEN a store that checked, once, that no earlier version kept ends
    store = table.store()
    assert store.recall(ENDED) is None
    before = table.requests()

    # WHEN a step records web-0's drain with its end check, and then the event ends for web-0
    assert store.record_drain_unless(EVENT, "web-0", MEMENTO, ENDED) is None
    recorded = table.requests() - before
    assert store.remember(ENDED, COMPLETED) == COMPLETED

    # THEN the record and its check took one request, and the end's read of the drains finds it
    assert recorded == 1
    assert store.drains(EVENT) == {"web-0": MEMENTO}
    # ... and the end's rows are no drain: every drain listed is a VM's
    assert [(drain.event_key, drain.vm) for drain in store.all_drains()] == [(EVENT, "web-0")]


def test_a_drain_recorded_after_its_end_returns_the_end(table: Table) -> None:
    # GIVEN the event ended for web-0 (another invocation, after this step read that it had not)
    store = table.store()
    store.remember(ENDED, COMPLETED)

    # WHEN the step records its drain with its end check
    found = store.record_drain_unless(EVENT, "web-0", MEMENTO, ENDED)

    # THEN it learns of the end (and puts back what it drained itself)
    assert found == COMPLETED


def test_the_first_end_stays_and_a_second_drain_of_the_vm_still_sees_no_end(table: Table) -> None:
    store = table.store()
    # GIVEN web-0 drained once already in the event (its mark is there), the event not ended
    assert store.record_drain_unless(EVENT, "web-0", MEMENTO, ENDED) is None

    # WHEN it is drained again, then two ends come
    again = store.record_drain_unless(EVENT, "web-0", {**MEMENTO, "again": True}, ENDED)
    first = store.remember(ENDED, COMPLETED)
    second = store.remember(ENDED, json.dumps({"status": "canceled"}).encode())

    # THEN the second drain is recorded and finds no end; the first end processed stays
    assert again is None
    assert store.drains(EVENT) == {"web-0": {**MEMENTO, "again": True}}
    assert first == second == COMPLETED


def test_a_steps_end_and_drains_are_read_in_one_query(table: Table) -> None:
    store = table.store()
    store.record_drain_unless(EVENT, "web-0", MEMENTO, ENDED)
    store.record_drain(EVENT, "web-1", MEMENTO)
    store.remember(f"ended|{EVENT}|web-1", COMPLETED)
    before = table.requests()

    # WHEN a step of web-0 glances at its end and its drain
    glanced = store.glance([ENDED], EVENT, ["web-0"])

    # THEN one request brings both, and nothing of web-1
    assert table.requests() - before == 1
    assert (glanced.recalled, glanced.drains) == ({ENDED: None}, {"web-0": MEMENTO})


def test_an_end_an_earlier_version_kept_counts_while_such_ends_may_matter(table: Table) -> None:
    # GIVEN web-0's end as an earlier version remembered it
    table.write_end_as_earlier_versions(ENDED, COMPLETED)
    store = table.store()

    # WHEN the store is asked about it, a step drains, and another end comes
    glanced = store.glance([ENDED], EVENT, ["web-0"])
    recalled = store.recall(ENDED)
    found = store.record_drain_unless(EVENT, "web-0", MEMENTO, ENDED)
    kept = store.remember(ENDED, json.dumps({"status": "canceled"}).encode())

    # THEN every read finds the earlier end, and it stays the first
    assert glanced.recalled == {ENDED: COMPLETED}
    assert recalled == found == kept == COMPLETED


def test_earlier_ends_are_looked_for_once_a_recheck_and_no_more_after_two_quiet_checks(table: Table) -> None:
    # GIVEN a table where no earlier version kept an end
    store = table.store()

    def looks(then: float = 0) -> int:
        table.clock.advance(then)
        before = table.requests()
        store.recall(ENDED)
        return table.requests() - before - 1  # the read of the end itself is one request

    # WHEN ends are read now, soon after, a recheck later, and long after
    # THEN the earlier layout is looked at by the first read and the recheck only
    assert [looks(), looks(1), looks(EARLIER_ENDS_RECHECK_SECONDS), looks(EARLIER_ENDS_RECHECK_SECONDS * 10)] == [
        1,
        0,
        1,
        0,
    ]


def test_an_earlier_end_older_than_any_message_no_longer_counts(table: Table) -> None:
    # GIVEN an earlier version's end, looked at once the events topic keeps no message that old
    table.write_end_as_earlier_versions(ENDED, COMPLETED)
    table.clock.advance(EARLIER_ENDS_LOOKBACK + timedelta(minutes=1))

    # WHEN the store reads web-0's end
    # THEN it no longer looks there: ends are only where this version keeps them
    assert table.store().recall(ENDED) is None
