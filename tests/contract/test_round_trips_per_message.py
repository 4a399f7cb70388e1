"""Round trips and writes per message of the core on each cloud store: a VM's own Scheduled Reboot
(claim, decide, drain, approve, complete) and its Completed (restore, release), counted where the
requests leave the client (bench/store_counting.py) over the throughput bench's workload
(bench/throughput.py `count_per_message`), on Azurite and on the Firestore emulator.

At most `MOST_PER_MESSAGE` round trips per message of either kind. The writes are reported, not
bounded here: docs/performance.md ("Core throughput per store") lists both per step.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from azure.data.tables import TableServiceClient
from google.cloud import firestore

from bench.store_counting import RoundTrips, counting_firestore, table_hook
from bench.throughput import count_per_message
from functions.azure_app.tables import TableAuditLog, TableStateStore
from functions.core.ports import AuditLog, StateStore
from functions.gcp_app.firestore_audit import FirestoreAuditLog
from functions.gcp_app.firestore_store import FirestoreStateStore
from tests.contract.backends import new_project
from tests.kit.clock import FakeClock

pytestmark = pytest.mark.peer

MOST_PER_MESSAGE = 7
KINDS = ("scheduled", "completed")


def _counted(store: StateStore, audit: AuditLog, counter: RoundTrips) -> dict[str, tuple[float, float]]:
    clock = FakeClock()
    problems = count_per_message(store, audit, counter, clock.now)
    assert problems == []
    return {kind: counter.per_envelope(kind) for kind in KINDS}


@pytest.fixture
def tables(azurite_tables: str) -> Iterator[tuple[StateStore, AuditLog, RoundTrips]]:
    counter = RoundTrips()
    with ExitStack() as opened:
        service = TableServiceClient.from_connection_string(azurite_tables, raw_response_hook=table_hook(counter))
        opened.callback(service.close)
        names = [f"t{uuid.uuid4().hex[:16]}" for _ in range(2)]
        for name in names:
            service.create_table(name)
        state, audit = (service.get_table_client(name) for name in names)
        yield TableStateStore(state), TableAuditLog(audit), counter


@pytest.fixture
def firestore_stores(firestore_emulator: str) -> Iterator[tuple[StateStore, AuditLog, RoundTrips]]:
    counter = RoundTrips()
    client = counting_firestore(firestore.Client(project=new_project()), counter)
    yield FirestoreStateStore(client), FirestoreAuditLog(client), counter
    client.close()


def _check(per_kind: dict[str, tuple[float, float]]) -> None:
    report = ", ".join(
        f"{kind}: {trips:g} round trips ({writes:g} writes)" for kind, (trips, writes) in per_kind.items()
    )
    over = {kind: trips for kind, (trips, _) in per_kind.items() if trips > MOST_PER_MESSAGE}
    assert not over, f"more than {MOST_PER_MESSAGE} round trips per message: {report}"


def test_table_storage_takes_at_most_seven_round_trips_per_message(
    tables: tuple[StateStore, AuditLog, RoundTrips],
) -> None:
    _check(_counted(*tables))


def test_firestore_takes_at_most_seven_round_trips_per_message(
    firestore_stores: tuple[StateStore, AuditLog, RoundTrips],
) -> None:
    _check(_counted(*firestore_stores))
