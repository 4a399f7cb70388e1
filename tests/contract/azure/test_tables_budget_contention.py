"""A pool's budget entity that other invocations keep writing, on Azurite: the reserving
invocation reads it again after a pause of a few milliseconds, as many times as `BUDGET_ATTEMPTS`,
before it gives the report back to the bus (every VM of a large event writes that one entity, so
conflicts in a row are expected, and a redelivery goes to the back of the queue)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from azure.data.tables import TableServiceClient

from functions.azure_app.tables import BUDGET_ATTEMPTS, TableStateStore, TableStorageUnavailableError

pytestmark = pytest.mark.peer


def test_a_budget_entity_written_between_each_read_and_write_is_tried_again_shortly(azurite_tables: str) -> None:
    # GIVEN a store whose every read of the pool's budget entity is followed by another worker's write
    table = f"t{uuid.uuid4().hex[:16]}"
    TableServiceClient.from_connection_string(azurite_tables).create_table(table)
    other = TableStateStore(TableServiceClient.from_connection_string(azurite_tables).get_table_client(table))
    other.reserve("web", "azure:first", ["web-0"], None)
    writes: list[str] = []

    def after_each_response(response: Any) -> None:
        if response.http_request.method == "GET" and "RowKey='web'" in response.http_request.url:
            key = f"azure:other-{len(writes)}"
            other.reserve("web", key, [f"vm-{len(writes)}"], None)
            writes.append(key)

    service = TableServiceClient.from_connection_string(azurite_tables, raw_response_hook=after_each_response)
    pauses: list[float] = []
    store = TableStateStore(service.get_table_client(table), sleep=pauses.append)
    # WHEN it reserves a slot
    with pytest.raises(TableStorageUnavailableError):
        store.reserve("web", "azure:mine", ["web-1"], None)
    # THEN it tried BUDGET_ATTEMPTS times, pausing a few milliseconds (growing) after each conflict
    assert BUDGET_ATTEMPTS == 16
    assert len(writes) == len(pauses) == BUDGET_ATTEMPTS
    assert all(0.001 * (attempt + 1) <= pause <= 0.005 * (attempt + 1) for attempt, pause in enumerate(pauses))
