"""Round trips and writes per message of the core on each cloud store: a VM's own Scheduled Reboot
(claim, decide, drain, approve, complete) and its Completed (restore, release), counted where the
requests leave the client (bench/store_counting.py) over the throughput bench's workload
(bench/throughput.py `count_per_message`), on Azurite and on the Firestore emulator.

The target is at most `TARGET` round trips per message of either kind, counted with the default
policy (no budget: an unlimited pool keeps no record) and with a budget on the pool (its record read,
written, released). Firestore meets it either way; Table Storage with the default policy, and two
above it with a budget. The tests hold each
store to exactly the figure it has reached (`REACHED`): a change that adds a round trip fails here,
and one that saves one updates the figure here and in docs/performance.md ("Core throughput per
store").

- Firestore (with a budget 7 per Scheduled, 7 per Completed; without, 6 and 5): a Scheduled reads
  its end mark, its VM's drain documents and its pool's budget document in one `BatchGetDocuments`
  (`StateStore.glance`; the budget read is a first guess its conditional write checks), and records
  the drain removed in a commit that fails when the end mark exists (`StateStore.record_drain_unless`)
  instead of reading the end mark again.
- Table Storage (with a budget 9 per Scheduled, 9 per Completed; without, 7 and 7): a request
  reads one entity or one query and writes one partition. A VM's end lives beside the event's
  drains (functions/azure_app/tables/ends.py), so a Scheduled reads its end and drain in one query
  and records its drain with the end check in one transaction. A message still touches the claims,
  budget and parking partitions and the audit table apart: with a budget, its record's read and
  write are the two above 7 (7 would take the budget, its waiting line and its joins in one
  partition per pool, and the claim completed with the audit records; not done).

The writes are reported, not bounded here: docs/performance.md lists both per step.
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
from functions.core.policy import Policy
from functions.core.ports import AuditLog, StateStore
from functions.gcp_app.firestore_audit import FirestoreAuditLog
from functions.gcp_app.firestore_store import FirestoreStateStore
from tests.contract.backends import new_project
from tests.kit.clock import FakeClock

pytestmark = pytest.mark.peer

TARGET = 7  # the product requirement, per message of either kind
# What each store takes today, per kind, with the default policy (no budget: an unlimited pool keeps
# no record) and with a budget on the pool (its record read, written and released); see the module
# docstring for why Table Storage is above TARGET with a budget.
REACHED = {
    ("table storage", "no budget"): {"scheduled": 7, "completed": 7},
    ("table storage", "budget"): {"scheduled": 9, "completed": 9},
    ("firestore", "no budget"): {"scheduled": 6, "completed": 5},
    ("firestore", "budget"): {"scheduled": 7, "completed": 7},
}
POLICIES = {"no budget": Policy(), "budget": Policy(default_max_drained=1000)}
KINDS = ("scheduled", "completed")
_BREAKDOWN: dict[str, str] = {}


def _counted(store: StateStore, audit: AuditLog, counter: RoundTrips, budget: str) -> dict[str, tuple[float, float]]:
    clock = FakeClock()
    problems = count_per_message(store, audit, counter, clock.now, policy=POLICIES[budget])
    assert problems == []
    counted = {kind: counter.per_envelope(kind) for kind in KINDS}
    # Each step's share, for the message of a test that fails.
    _BREAKDOWN[budget] = "; ".join(f"{kind}: {counter.breakdown(kind)}" for kind in KINDS)
    return counted


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


def _check(store: str, budget: str, per_kind: dict[str, tuple[float, float]]) -> None:
    report = ", ".join(
        f"{kind}: {trips:g} round trips ({writes:g} writes)" for kind, (trips, writes) in per_kind.items()
    )
    most = REACHED[(store, budget)]
    counted = {kind: trips for kind, (trips, _) in per_kind.items()}
    assert counted == most, (
        f"{store}, {budget}: round trips per message other than {most} (target {TARGET}): {report}; "
        f"by step: {_BREAKDOWN.get(budget, '')}"
    )


@pytest.mark.parametrize("budget", list(POLICIES))
def test_table_storage_takes_the_round_trips_per_message_reached(
    tables: tuple[StateStore, AuditLog, RoundTrips], budget: str
) -> None:
    _check("table storage", budget, _counted(*tables, budget))


@pytest.mark.parametrize("budget", list(POLICIES))
def test_firestore_takes_the_round_trips_per_message_reached(
    firestore_stores: tuple[StateStore, AuditLog, RoundTrips], budget: str
) -> None:
    _check("firestore", budget, _counted(*firestore_stores, budget))
