"""What is Table Storage's own in the StateStore and AuditLog on it, against Azurite: errors naming the
table, escaped and shortened keys, a pool's reservations in one entity, and the wiring.

What every store does (claims, budget, drains, remembered values, waits, the audit log) is one
suite over SQLite, Azurite and the Firestore emulator: tests/contract/test_state_store.py and
tests/contract/test_audit_log.py.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

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
from functions.core.holds import LONGEST_HOLD
from functions.core.ports import AuditRecord, Claim, Reservation
from tests.contract.backends import HELD_UNTIL, table_backend
from tests.peers import free_port

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
LEASE = timedelta(minutes=5)
# 1,000 VMs (the most an event lists) of 80 characters (the longest name): 83,000 characters of JSON.
LARGEST_EVENT_VMS = [f"vmss-{n:04d}-" + "x" * 70 + f"_{n:03d}" for n in range(1000)]


def _record(vm: str, event_id: str, kind: str) -> AuditRecord:
    return AuditRecord(time=NOW, kind=kind, envelope_id=f"env-{event_id}", event_id=event_id, vm=vm)


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
    state = table_backend(azurite_tables).store
    answers = [
        state.reserve("default", f"azure:{n}", LARGEST_EVENT_VMS, None, now=NOW, expires_at=HELD_UNTIL).admitted
        for n in range(12)
    ]

    # WHEN the entity of the pool's budget is full
    # THEN the next event is not admitted (it waits for a slot, as for a budget) instead of failing
    assert (answers[0], answers[-1]) == (True, False)
    refused = answers.index(False)
    assert answers == [True] * refused + [False] * (len(answers) - refused)
    # ... and it is admitted once another event lets its slot go
    state.release("default", "azure:0")
    assert state.reserve("default", f"azure:{refused}", LARGEST_EVENT_VMS, None, now=NOW, expires_at=HELD_UNTIL)


class _NoCredential:
    """A credential that must not be asked for a token in the test above."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        raise AssertionError(f"no token should be requested, asked for {scopes}")


@pytest.mark.peer
def test_a_reservation_an_earlier_version_wrote_holds_the_longest_hold_from_when_it_is_found(
    azurite_tables: str,
) -> None:
    # GIVEN a pool's budget entity as the version before expiries wrote it: no terms
    service = TableServiceClient.from_connection_string(azurite_tables)
    name = f"t{uuid.uuid4().hex[:16]}"
    service.create_table(name)
    table = service.get_table_client(name)
    reservations = {"azure:e-old": ["web-0"]}
    table.create_entity({"PartitionKey": "budget", "RowKey": "web", "reservations": json.dumps(reservations)})
    store = TableStateStore(table)

    # WHEN events ask for its slot when it is first found, before the longest hold from then, and at it
    first = store.reserve("web", "azure:e1", ["web-1"], 1, now=NOW, expires_at=HELD_UNTIL)
    before = store.reserve("web", "azure:e1", ["web-1"], 1, now=NOW + LONGEST_HOLD / 2, expires_at=HELD_UNTIL)
    at = store.reserve("web", "azure:e1", ["web-1"], 1, now=NOW + LONGEST_HOLD, expires_at=HELD_UNTIL)

    # THEN it counts until then, and is reported expired once, without an admission time
    assert (first.admitted, before.admitted, at.admitted) == (False, False, True)
    assert at.expired == (Reservation("azure:e-old", ("web-0",), None, NOW + LONGEST_HOLD),)


@pytest.mark.peer
def test_drains_an_earlier_version_wrote_without_their_event_key_are_listed_under_it(azurite_tables: str) -> None:
    # GIVEN a drain entity as earlier versions wrote it (no event_key property: only its escaped partition key)
    service = TableServiceClient.from_connection_string(azurite_tables)
    name = f"t{uuid.uuid4().hex[:16]}"
    table = service.create_table(name)
    table.create_entity(
        {"PartitionKey": f"drain:{escape_key('gce:e/1')}", "RowKey": "vm-0", "vm": "vm-0", "memento": "{}"}
    )

    # WHEN every drain is listed
    (drain,) = TableStateStore(table).all_drains()

    # THEN it is under its event key, unescaped
    assert (drain.event_key, drain.vm, drain.record) == ("gce:e/1", "vm-0", {})
