"""The Table Storage StateStore and AuditLog against Azurite, held to the SQLite store's contract.

Every behavioural test runs twice: on SqliteStore(":memory:") (the reference the local app and
replay use) and on TableStateStore/TableAuditLog over Azurite (tests/peers_azurite.py starts it).
Each Azurite test gets tables of its own. Races use two clients, as two workers would.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import pytest
from azure.data.tables import TableServiceClient

from functions.azure_app import settings as names
from functions.azure_app.settings import Settings
from functions.azure_app.tables import (
    TableAuditLog,
    TableStateStore,
    TableStorageConfigError,
    TableStorageUnavailableError,
    escape_key,
)
from functions.azure_app.wiring import AZURE_LB, READINESS, build_deps
from functions.core.ports import AuditLog, AuditRecord, Claim, StateStore
from functions.local_app.store import SqliteStore
from tests.peers import free_port

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
LEASE = timedelta(minutes=5)
T = TypeVar("T")


@dataclass
class Stores:
    state: StateStore
    audit: AuditLog
    # Another client over the same state, as a second worker would hold.
    second_client: Callable[[], StateStore]


def _table_stores(connection_string: str) -> Stores:
    service = TableServiceClient.from_connection_string(connection_string)
    state_table, audit_table = (f"t{uuid.uuid4().hex[:16]}" for _ in range(2))
    service.create_table(state_table)
    service.create_table(audit_table)

    def second_client() -> StateStore:
        other = TableServiceClient.from_connection_string(connection_string)
        return TableStateStore(other.get_table_client(state_table))

    return Stores(
        TableStateStore(service.get_table_client(state_table)),
        TableAuditLog(service.get_table_client(audit_table)),
        second_client,
    )


@pytest.fixture(params=["sqlite", pytest.param("tables", marks=pytest.mark.peer)])
def stores(request: pytest.FixtureRequest) -> Iterator[Stores]:
    if request.param == "tables":
        yield _table_stores(request.getfixturevalue("azurite_tables"))
        return
    store = SqliteStore(":memory:")
    yield Stores(store, store, lambda: store)  # one connection, serialised by its own lock
    store.close()


def race(first: Callable[[], T], second: Callable[[], T]) -> list[T]:
    """Run both at the same moment (as far as two threads can) and return both answers."""
    barrier = threading.Barrier(2)

    def run(call: Callable[[], T]) -> T:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(run, first), pool.submit(run, second)]
        return [future.result(timeout=30) for future in futures]


# ---------------------------------------------------------------- claims


def test_a_first_claim_is_ours_and_a_second_is_busy_while_the_lease_runs(stores: Stores) -> None:
    # GIVEN an envelope nobody has claimed
    # WHEN it is claimed, and claimed again within the lease
    first = stores.state.claim("envelope-1", NOW, LEASE)
    second = stores.state.claim("envelope-1", NOW + LEASE / 2, LEASE)

    # THEN the first invocation owns it and the second must retry later
    assert (first, second) == (Claim.CLAIMED, Claim.BUSY)


def test_an_abandoned_claim_is_taken_over_at_once_but_a_done_one_stays_done(stores: Stores) -> None:
    # GIVEN a claim whose invocation failed and gave it back, and another that completed
    stores.state.claim("envelope-1", NOW, LEASE)
    stores.state.abandon("envelope-1", NOW + timedelta(seconds=1))
    stores.state.claim("envelope-2", NOW, LEASE)
    stores.state.complete("envelope-2", NOW)
    stores.state.abandon("envelope-2", NOW)

    # WHEN both are claimed again seconds later, well within the lease
    again = stores.state.claim("envelope-1", NOW + timedelta(seconds=2), LEASE)
    done = stores.state.claim("envelope-2", NOW + timedelta(seconds=2), LEASE)

    # THEN the abandoned one is ours at once; abandoning never undoes a completion
    assert (again, done) == (Claim.CLAIMED, Claim.DONE)


def test_a_completed_claim_answers_done_for_ever(stores: Stores) -> None:
    # GIVEN an envelope processed to the end
    stores.state.claim("envelope-1", NOW, LEASE)
    stores.state.complete("envelope-1", NOW)

    # WHEN its duplicate arrives, even long after any lease
    answer = stores.state.claim("envelope-1", NOW + timedelta(days=3), LEASE)

    # THEN it is acknowledged as a duplicate
    assert answer is Claim.DONE


def test_an_expired_lease_is_taken_over_once(stores: Stores) -> None:
    # GIVEN a claim whose invocation died (its lease ran out)
    stores.state.claim("envelope-1", NOW, LEASE)
    later = NOW + LEASE + timedelta(seconds=1)

    # WHEN the redelivery claims it, and another copy right after
    takeover = stores.state.claim("envelope-1", later, LEASE)
    again = stores.state.claim("envelope-1", later, LEASE)

    # THEN the redelivery takes it over with a fresh lease
    assert (takeover, again) == (Claim.CLAIMED, Claim.BUSY)


def test_two_workers_racing_for_an_expired_claim_take_it_once(stores: Stores) -> None:
    # GIVEN an expired claim and two workers holding its redeliveries
    stores.state.claim("envelope-1", NOW, LEASE)
    later = NOW + LEASE * 2
    other = stores.second_client()

    # WHEN both claim at once
    answers = race(
        lambda: stores.state.claim("envelope-1", later, LEASE),
        lambda: other.claim("envelope-1", later, LEASE),
    )

    # THEN exactly one of them processes it
    assert sorted(answers) == [Claim.BUSY, Claim.CLAIMED]


def test_keys_with_characters_tables_forbid_stay_distinct(stores: Stores) -> None:
    # GIVEN keys with '/', '\\', '#', '?', '%' and a control character
    keys = ["a/b", "a%2Fb", "a\\b", "a#b", "a?b", "a\tb", "a%b"]

    # WHEN each is claimed
    answers = [stores.state.claim(key, NOW, LEASE) for key in keys]

    # THEN every one is its own claim
    assert answers == [Claim.CLAIMED] * len(keys)


# ---------------------------------------------------------------- budget


def test_reserve_admits_within_the_limit_and_refuses_beyond_it(stores: Stores) -> None:
    # GIVEN a pool of budget 2 with one VM drained by event A
    assert stores.state.reserve("web", "azure:a", ["web-0"], 2)

    # WHEN event B asks for one more VM, then event C for another
    second = stores.state.reserve("web", "azure:b", ["web-1"], 2)
    third = stores.state.reserve("web", "azure:c", ["web-2"], 2)

    # THEN B fits and C waits
    assert (second, third) == (True, False)


def test_an_event_alone_in_its_pool_is_admitted_whatever_its_size(stores: Stores) -> None:
    # GIVEN an empty pool of budget 1
    # WHEN one event asks for three VMs
    # THEN it goes: nothing else is drained (docs/contracts.md#budget-and-trust)
    assert stores.state.reserve("web", "azure:a", ["web-0", "web-1", "web-2"], 1)


def test_another_vm_of_an_admitted_event_joins_its_reservation_and_counts(stores: Stores) -> None:
    # GIVEN event A admitted for web-0 in a pool of budget 2
    assert stores.state.reserve("web", "azure:a", ["web-0"], 2)

    # WHEN web-1's own report of A asks for it, whatever the limit (A is admitted already)
    joined = stores.state.reserve("web", "azure:a", ["web-1"], 1)

    # THEN it is admitted, and the pool counts both: event B finds no room
    assert joined
    assert not stores.state.reserve("web", "azure:b", ["web-2"], 2)
    stores.state.release("web", "azure:a")
    assert stores.state.reserve("web", "azure:b", ["web-2"], 2)


def test_reserve_is_idempotent_per_event_and_counts_shared_vms_once(stores: Stores) -> None:
    # GIVEN event A holding web-0 and web-1 in a pool of budget 2
    assert stores.state.reserve("web", "azure:a", ["web-0", "web-1"], 2)

    # WHEN A asks again (a retry) and B asks for a VM A already holds
    retry = stores.state.reserve("web", "azure:a", ["web-0", "web-1"], 2)
    overlapping = stores.state.reserve("web", "azure:b", ["web-1"], 2)

    # THEN both are admitted: no new VM leaves the pool
    assert (retry, overlapping) == (True, True)


def test_release_frees_the_slot_and_pools_are_separate(stores: Stores) -> None:
    # GIVEN a full pool of budget 1, and another pool
    assert stores.state.reserve("web", "azure:a", ["web-0"], 1)
    assert not stores.state.reserve("web", "azure:b", ["web-1"], 1)
    assert stores.state.reserve("db", "azure:c", ["db-0"], 1)

    # WHEN the first event releases its slot
    stores.state.release("web", "azure:a")

    # THEN the waiting event fits; releasing an unknown event changes nothing
    stores.state.release("web", "azure:unknown")
    assert stores.state.reserve("web", "azure:b", ["web-1"], 1)


def test_no_limit_admits_everything(stores: Stores) -> None:
    # GIVEN an unlimited pool holding one event
    assert stores.state.reserve("default", "azure:a", ["vm-0"], None)

    # WHEN many more ask
    # THEN all are admitted
    assert all(stores.state.reserve("default", f"azure:{n}", [f"vm-{n}"], None) for n in range(1, 6))


@pytest.mark.parametrize("round_", range(5))
def test_two_events_racing_for_the_last_slot_admit_exactly_one(stores: Stores, round_: int) -> None:
    # GIVEN a pool of budget 2 with one slot taken, and two workers
    pool = f"web-{round_}"
    assert stores.state.reserve(pool, "azure:a", ["web-0"], 2)
    other = stores.second_client()

    # WHEN two events ask for the last slot at the same moment
    answers = race(
        lambda: stores.state.reserve(pool, "azure:b", ["web-1"], 2),
        lambda: other.reserve(pool, "azure:c", ["web-2"], 2),
    )

    # THEN exactly one is admitted, and the budget holds afterwards
    assert sorted(answers) == [False, True]
    assert not stores.state.reserve(pool, "azure:d", ["web-3"], 2)


# ---------------------------------------------------------------- drains


def test_drains_are_remembered_per_event_with_their_mementos(stores: Stores) -> None:
    # GIVEN two VMs drained for event A (one re-recorded) and one for event B
    memento = {"azure_lb": {"nic": [{"nic_id": "/subscriptions/s/x", "ip_configuration": "ipconfig1", "pools": []}]}}
    stores.state.record_drain("azure:a", "web-0", {"old": True})
    stores.state.record_drain("azure:a", "web-0", memento)
    stores.state.record_drain("azure:a", "web/1", {})
    stores.state.record_drain("azure:b", "web-2", {"readiness": True})

    # WHEN event A's drains are read, then one is forgotten
    before = dict(stores.state.drains("azure:a"))
    stores.state.forget_drain("azure:a", "web-0")

    # THEN each event sees its own, the latest memento wins, and forgetting removes one VM only
    assert before == {"web-0": memento, "web/1": {}}
    assert dict(stores.state.drains("azure:a")) == {"web/1": {}}
    assert dict(stores.state.drains("azure:b")) == {"web-2": {"readiness": True}}
    assert dict(stores.state.drains("azure:none")) == {}


# ---------------------------------------------------------------- remembered values


def test_remember_keeps_the_first_value(stores: Stores) -> None:
    # GIVEN a command remembered under its key
    first = b'{"command_id":"c1","issued_at":"2026-03-01T12:00:00Z"}\x00\xff'
    assert stores.state.remember("command:c1", first) == first

    # WHEN a retry re-builds it with another issued_at
    answer = stores.state.remember("command:c1", b'{"command_id":"c1","issued_at":"2026-03-01T12:00:09Z"}')

    # THEN the retry gets the very bytes of the first attempt
    assert answer == first


def test_recall_reads_what_remember_stored_and_never_stores(stores: Stores) -> None:
    # GIVEN a key with characters Table keys refuse, never remembered
    key = "ended|azure:a/b\\c#d?e%f"

    # WHEN it is recalled, THEN there is nothing, and the recall stored nothing either
    assert stores.state.recall(key) is None
    assert stores.state.remember(key, b"first\x00\xff") == b"first\x00\xff"

    # THEN a recall reads what remember stored, from any client, and a recall changes nothing
    assert stores.state.recall(key) == b"first\x00\xff"
    assert stores.second_client().recall(key) == b"first\x00\xff"
    assert stores.state.remember(key, b"second") == b"first\x00\xff"
    assert stores.state.recall("ended|azure:other") is None


# ---------------------------------------------------------------- waits


def test_parked_events_come_oldest_first_and_keep_their_place(stores: Stores) -> None:
    # GIVEN three events waiting in a pool (parked out of key order) and one in another pool
    stores.state.park("web", "azure:c", b"c-1", NOW)
    stores.state.park("web", "azure:a", b"a-1", NOW + timedelta(seconds=1))
    stores.state.park("web", "azure:b", b"b-1", NOW + timedelta(seconds=2))
    stores.state.park("db", "azure:d", b"d-1", NOW)

    # WHEN the oldest is parked again with a later envelope, and the newest leaves
    stores.state.park("web", "azure:c", b"c-2", NOW + timedelta(seconds=5))
    stores.state.unpark("web", "azure:b")

    # THEN the line is unchanged but for the one that left, with the newer envelope
    parked = stores.state.parked("web")
    assert [(p.event_key, p.envelope, p.parked_at) for p in parked] == [
        ("azure:c", b"c-2", NOW),
        ("azure:a", b"a-1", NOW + timedelta(seconds=1)),
    ]
    assert [p.event_key for p in stores.state.parked("db")] == ["azure:d"]


# ---------------------------------------------------------------- audit


def _record(vm: str, event_id: str, kind: str, at: datetime = NOW, **fields: Any) -> AuditRecord:
    return AuditRecord(time=at, kind=kind, envelope_id=f"env-{event_id}", event_id=event_id, vm=vm, **fields)


def _kinds(records: Sequence[AuditRecord]) -> list[tuple[str, str, str]]:
    return [(r.vm, r.event_id, r.kind) for r in records]


def test_audit_returns_a_vms_records_oldest_first_in_write_order(stores: Stores) -> None:
    # GIVEN one invocation's records written at the same instant, and another VM's record
    for kind in ("event", "decision", "action"):
        stores.audit.append(_record("web-0", "E-1", kind))
    stores.audit.append(_record("web-1", "E-1", "event"))

    # WHEN the log is read for web-0
    records = stores.audit.query(vm="web-0")

    # THEN they come in the order they were written
    assert _kinds(records) == [("web-0", "E-1", "event"), ("web-0", "E-1", "decision"), ("web-0", "E-1", "action")]


def test_audit_finds_an_event_across_vms_whatever_the_case_of_its_id(stores: Stores) -> None:
    # GIVEN records of one Azure event from two VMs, and of another event
    stores.audit.append(_record("web-0", "C7061BAC-AFDC", "event"))
    stores.audit.append(_record("web-1", "c7061bac-afdc", "duplicate"))
    stores.audit.append(_record("web-0", "OTHER", "event"))

    # WHEN the log is read by event id (in lower case), and by event and VM
    by_event = stores.audit.query(event_id="c7061bac-afdc")
    by_both = stores.audit.query(vm="web-1", event_id="C7061BAC-AFDC")

    # THEN every VM's record of the event comes, oldest first
    assert _kinds(by_event) == [("web-0", "C7061BAC-AFDC", "event"), ("web-1", "c7061bac-afdc", "duplicate")]
    assert _kinds(by_both) == [("web-1", "c7061bac-afdc", "duplicate")]
    assert len(stores.audit.query()) == 3


def test_audit_records_round_trip_every_field(stores: Stores) -> None:
    # GIVEN an approval record with every field set, and a malformed-envelope record (no VM)
    approval = AuditRecord(
        time=NOW,
        kind="action",
        envelope_id="a" * 64,
        event_id="E-1",
        vm="web/0#1",
        action="approve",
        status="scheduled",
        rule="azure-scheduled",
        reason="drained; approve after the drain period",
        at=NOW + timedelta(seconds=30, milliseconds=250),
        detail={"kind": "reboot", "cloud": "azure", "resources": ["web/0#1"]},
    )
    malformed = AuditRecord(NOW, "malformed", "b" * 64, "", "", action="none", reason="not JSON")
    stores.audit.append(approval)
    stores.audit.append(malformed)

    # WHEN they are read back
    # THEN nothing is lost or changed
    assert list(stores.audit.query(vm="web/0#1")) == [approval]
    assert list(stores.audit.query(vm="")) == [malformed]


# ---------------------------------------------------------------- sizes that come from the input
# A Table Storage property holds at most 64 KiB (a string 32K UTF-16 characters), an entity 1 MiB,
# a key 1 KiB: Azurite refuses what is larger, as Table Storage does.

# 1,000 VMs (the most an event lists) of 80 characters (the longest name): 83,000 characters of JSON.
LARGEST_EVENT_VMS = [f"vmss-{n:04d}-" + "x" * 70 + f"_{n:03d}" for n in range(1000)]


def test_an_event_of_a_thousand_long_vm_names_takes_its_budget_slot(stores: Stores) -> None:
    # GIVEN a pool of budget 1000, and the largest event there can be
    # WHEN it reserves its slot, and another event asks for one VM more
    admitted = stores.state.reserve("web", "azure:a", LARGEST_EVENT_VMS, 1000)
    second = stores.state.reserve("web", "azure:b", ["web-extra"], 1000)

    # THEN the first is admitted and every one of its VMs counts against the budget
    assert (admitted, second) == (True, False)
    stores.state.release("web", "azure:a")
    assert stores.state.reserve("web", "azure:b", ["web-extra"], 1000)


def test_a_memento_larger_than_a_property_is_kept_whole(stores: Stores) -> None:
    # GIVEN a VM in 400 backend pools: a memento of about 100 KB
    pools = [
        f"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/lb/pool-{n}" for n in range(400)
    ]
    memento = {"memento": {"nic": [{"nic_id": "/subscriptions/s/nic-0", "pools": pools}]}, "state": "removed"}

    # WHEN its drain is recorded and read back
    stores.state.record_drain("azure:a", "web-0", memento)

    # THEN it comes back as it was; recording a small one again replaces it whole
    assert dict(stores.state.drains("azure:a")) == {"web-0": memento}
    stores.state.record_drain("azure:a", "web-0", {"state": "located"})
    assert dict(stores.state.drains("azure:a")) == {"web-0": {"state": "located"}}


def test_a_value_and_an_envelope_larger_than_a_property_are_kept_whole(stores: Stores) -> None:
    # GIVEN a remembered value of 100 KB and an envelope of 250 KB waiting for the budget
    value = bytes(range(256)) * 400
    envelope = b"e" * (250 * 1024)

    # WHEN they are stored, then the envelope is replaced by a small one
    assert stores.state.remember("command:big", value) == value
    stores.state.park("web", "azure:a", envelope, NOW)
    (parked,) = stores.state.parked("web")
    stores.state.park("web", "azure:a", b"small", NOW + timedelta(seconds=1))

    # THEN each reads back whole, the replacement without a trace of the larger one
    assert stores.state.recall("command:big") == value
    assert parked.envelope == envelope
    assert [(p.envelope, p.parked_at) for p in stores.state.parked("web")] == [(b"small", NOW)]


def test_an_audit_record_naming_a_thousand_vms_is_appended_and_found(stores: Stores) -> None:
    # GIVEN a wait for the budget, audited under the VMs of the event it holds back
    record = _record(",".join(LARGEST_EVENT_VMS), "E-1", "action", action="wait", reason="r" * 100_000)

    # WHEN it is appended
    stores.audit.append(record)

    # THEN it is found under that name (cut, like its reason, to what an audit record keeps)
    (found,) = stores.audit.query(vm=record.vm)
    assert found == record
    assert max(len(found.vm), len(found.reason)) <= 2048
    assert stores.audit.query(vm="web-0") == []


# ---------------------------------------------------------------- Table Storage only


@pytest.mark.peer
def test_a_missing_table_is_a_config_error_naming_it(azurite_tables: str) -> None:
    # GIVEN a store on a table nobody created
    service = TableServiceClient.from_connection_string(azurite_tables)
    store = TableStateStore(service.get_table_client("nosuchtable"))

    # WHEN it is used
    # THEN the error names the table and the settings to check
    with pytest.raises(TableStorageConfigError, match=r"'nosuchtable' does not exist.*MBRIDGE_STATE_TABLE"):
        store.claim("envelope-1", NOW, LEASE)


def test_an_unreachable_table_service_is_retryable() -> None:
    # GIVEN a connection string to a port nobody listens on (no SDK retries, to fail at once)
    port = free_port()
    service = TableServiceClient.from_connection_string(
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
        f"TableEndpoint=http://127.0.0.1:{port}/devstoreaccount1;",
        retry_total=0,
    )
    audit = TableAuditLog(service.get_table_client("audit"))

    # WHEN a record is appended
    # THEN the failure asks for a redelivery
    with pytest.raises(TableStorageUnavailableError, match="cannot reach table 'audit'"):
        audit.append(_record("web-0", "E-1", "event"))


def test_escaped_keys_are_distinct_and_readable() -> None:
    # GIVEN values that differ only in characters Table keys forbid, or in the escape itself
    values = ["a/b", "a%2Fb", "a\\b", "a#b", "a?b", "a\x7fb", "web-0 é"]

    # WHEN they are escaped
    keys = [escape_key(value) for value in values]

    # THEN no two collide, none holds a forbidden character, and plain names stay as they are
    assert len(set(keys)) == len(values)
    assert not any(c in key for key in keys for c in "/\\#?\x7f")
    assert keys[-1] == "web-0 é"


def test_a_key_too_long_for_a_table_is_shortened_and_stays_distinct() -> None:
    # GIVEN two values of 2,000 characters that differ only in their last one, and one of 480
    first, second, longest_kept = "v" * 1999 + "a", "v" * 1999 + "b", "w" * 480

    # WHEN they are escaped
    keys = [escape_key(value) for value in (first, second, longest_kept)]

    # THEN the long ones keep their start and a digest of the whole, within Table Storage's 1 KiB,
    # and a key that fits is kept as it is
    assert keys[0] != keys[1]
    assert all(key.startswith("v" * 200 + "%~") and len(key) == 266 for key in keys[:2])
    assert keys[2] == longest_kept


@pytest.mark.peer
def test_the_wiring_builds_table_stores_on_the_configured_tables(azurite_tables: str) -> None:
    # GIVEN the app settings of a deployment on Azurite, with a load balancer
    state_table, audit_table = f"s{uuid.uuid4().hex[:12]}", f"a{uuid.uuid4().hex[:12]}"
    settings = Settings.from_env(
        {
            names.EVENTS_TOPIC: "maintenance-events",
            names.EVENTS_SUBSCRIPTION: "functions",
            names.SERVICEBUS_NAMESPACE: "mybus.servicebus.windows.net",
            names.TABLE_CONNECTION_STRING: azurite_tables,
            names.STATE_TABLE: state_table,
            names.AUDIT_TABLE: audit_table,
            names.LB_SUBSCRIPTION_ID: "00000000-0000-0000-0000-000000000000",
            names.LB_RESOURCE_GROUP: "rg-web",
            names.LB_NAME: "lb-web",
        }
    )

    # WHEN the worker builds its ports (no Azure credential is used before a call)
    deps = build_deps(settings, credential=_NoCredential())

    # THEN the stores work on the configured tables, created on the way
    assert deps.store.claim("envelope-1", NOW, LEASE) is Claim.CLAIMED
    deps.audit.append(_record("web-0", "E-1", "event"))
    service = TableServiceClient.from_connection_string(azurite_tables)
    assert len(list(service.get_table_client(state_table).list_entities())) == 1
    assert len(list(service.get_table_client(audit_table).list_entities())) == 1
    # ... and the balancer drains from the load balancer and through /readyz, under fixed names
    assert [name for name, _ in deps.balancer._balancers] == [AZURE_LB, READINESS]  # type: ignore[attr-defined]


@pytest.mark.peer
def test_a_pool_whose_reservations_fill_an_entity_makes_the_next_event_wait(azurite_tables: str) -> None:
    # GIVEN an unlimited pool holding events of 1,000 long VM names each
    stores = _table_stores(azurite_tables)
    answers = [stores.state.reserve("default", f"azure:{n}", LARGEST_EVENT_VMS, None) for n in range(12)]

    # WHEN the entity of the pool's budget is full
    # THEN the next event is not admitted (it waits for a slot, as for a budget) instead of failing
    assert (answers[0], answers[-1]) == (True, False)
    refused = answers.index(False)
    assert answers == [True] * refused + [False] * (len(answers) - refused)
    # ... and it is admitted once another event lets its slot go
    stores.state.release("default", "azure:0")
    assert stores.state.reserve("default", f"azure:{refused}", LARGEST_EVENT_VMS, None)


class _NoCredential:
    """A credential that must not be asked for a token in the test above."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        raise AssertionError(f"no token should be requested, asked for {scopes}")
