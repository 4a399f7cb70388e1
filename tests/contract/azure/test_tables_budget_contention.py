"""A pool's budget entity that other invocations write meanwhile, on Azurite.

Events admitted at once: the reserving invocation reads the entity again after a pause of a few
milliseconds, as many times as `BUDGET_ATTEMPTS`, before it gives the report back to the bus (a
redelivery goes to the back of the queue). VMs joining an admitted event at once: each writes an
entity of its own, and never conflicts with the others. An event let go while a VM joins it: the
join is taken back and the event admitted afresh.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from azure.data.tables import TableClient, TableServiceClient

from functions.azure_app.tables import BUDGET_ATTEMPTS, TableStateStore, TableStorageUnavailableError
from tests.contract.backends import HELD_UNTIL, NOW

pytestmark = pytest.mark.peer


@dataclass
class Table:
    """A fresh state table, and another worker's store on it."""

    connection: str
    name: str
    other: TableStateStore
    pauses: list[float] = field(default_factory=list)

    def client(self, hook: Callable[[Any], None] | None = None) -> TableClient:
        service = TableServiceClient.from_connection_string(self.connection, raw_response_hook=hook)
        return service.get_table_client(self.name)

    def store_racing(self, race: Callable[[], object], *, times: int) -> TableStateStore:
        """A store after whose first `times` reads of pool web's budget entity `race` runs (its
        pauses between attempts are recorded in `pauses` instead of slept)."""
        raced: list[object] = []

        def after_each_response(response: Any) -> None:
            request = response.http_request
            if request.method == "GET" and "RowKey='web'" in request.url and len(raced) < times:
                raced.append(race())

        return TableStateStore(self.client(after_each_response), sleep=self.pauses.append)


@pytest.fixture
def table(azurite_tables: str) -> Table:
    name = f"t{uuid.uuid4().hex[:16]}"
    TableServiceClient.from_connection_string(azurite_tables).create_table(name)
    other = TableStateStore(TableServiceClient.from_connection_string(azurite_tables).get_table_client(name))
    return Table(azurite_tables, name, other)


def test_a_budget_entity_written_between_each_read_and_write_is_tried_again_shortly(table: Table) -> None:
    # GIVEN a store whose every read of the pool's budget entity is followed by another worker's write
    table.other.reserve("web", "azure:first", ["web-0"], None, now=NOW, expires_at=HELD_UNTIL)
    writes: list[str] = []

    def admit_another() -> None:
        key = f"azure:other-{len(writes)}"
        table.other.reserve("web", key, [f"vm-{len(writes)}"], None, now=NOW, expires_at=HELD_UNTIL)
        writes.append(key)

    store = table.store_racing(admit_another, times=BUDGET_ATTEMPTS)
    # WHEN it reserves a slot
    with pytest.raises(TableStorageUnavailableError):
        store.reserve("web", "azure:mine", ["web-1"], None, now=NOW, expires_at=HELD_UNTIL)
    # THEN it tried BUDGET_ATTEMPTS times, pausing a few milliseconds (growing) after each conflict
    assert BUDGET_ATTEMPTS == 16
    assert len(writes) == len(table.pauses) == BUDGET_ATTEMPTS
    pauses = table.pauses
    assert all(0.001 * (attempt + 1) <= pause <= 0.005 * (attempt + 1) for attempt, pause in enumerate(pauses))


def test_vms_joining_an_admitted_event_at_once_never_conflict(table: Table) -> None:
    # GIVEN event A admitted for web-0, and another VM of A joining it between the read of the
    # pool's budget entity and the write that follows it (a large event: every VM joins at once)
    assert table.other.reserve("web", "azure:a", ["web-0"], 2, now=NOW, expires_at=HELD_UNTIL)
    store = table.store_racing(
        lambda: table.other.reserve("web", "azure:a", ["web-2"], 2, now=NOW, expires_at=HELD_UNTIL).admitted, times=1
    )
    # WHEN web-1's own report joins A
    assert store.reserve("web", "azure:a", ["web-1"], 2, now=NOW, expires_at=HELD_UNTIL)
    # THEN it never had to try again: a join writes the VM's own entity, not the pool's
    assert table.pauses == []
    # and all three count: event B finds no room until A lets its slot go
    assert not table.other.reserve("web", "azure:b", ["web-3"], 3, now=NOW, expires_at=HELD_UNTIL)
    table.other.release("web", "azure:a")
    assert table.other.reserve("web", "azure:b", ["web-3"], 3, now=NOW, expires_at=HELD_UNTIL)


def test_a_vm_joining_an_event_that_lets_its_slot_go_meanwhile_admits_it_afresh(table: Table) -> None:
    # GIVEN event A admitted for web-0, and A letting its slot go (its last drained VM was put
    # back) just after web-1's own report of it read the pool's budget entity
    assert table.other.reserve("web", "azure:a", ["web-0"], 1, now=NOW, expires_at=HELD_UNTIL)
    store = table.store_racing(lambda: table.other.release("web", "azure:a"), times=1)
    # WHEN web-1 joins A
    assert store.reserve("web", "azure:a", ["web-1"], 1, now=NOW, expires_at=HELD_UNTIL)
    # THEN its join was taken back and A admitted afresh for web-1, which counts (a join of a
    # reservation that is gone would have let web-1 be drained uncounted)
    assert not table.other.reserve("web", "azure:b", ["web-2"], 1, now=NOW, expires_at=HELD_UNTIL)
    assert list(table.client().query_entities("PartitionKey eq 'joins:web'")) == []
