"""The three backends of the StateStore and AuditLog ports, for their contract suites
(tests/contract/test_state_store.py, tests/contract/test_audit_log.py).

SQLite runs on a file of its own; Table Storage on tables of its own in the session's Azurite
(tests/peers_azurite.py); Firestore in a project of its own on the session's emulator
(tests/peers_firestore.py), which keeps each project's documents apart. The two peers carry the
`peer` marker: `-m "not peer"` runs the SQLite case alone, and a peer that is missing skips its
case by hand and fails it under CI=true (tests/peers.py).

`reboot` is an event's envelope for the tests that run the core's process on a backend.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from azure.data.tables import TableServiceClient
from google.cloud import firestore

from functions.azure_app.tables import TableAuditLog, TableStateStore
from functions.core.ports import AuditLog, StateStore
from functions.gcp_app.firestore_audit import FirestoreAuditLog
from functions.gcp_app.firestore_store import FirestoreStateStore
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from wire.envelope import encode, envelope_for_event
from wire.model import EventKind, EventStatus, MaintenanceEvent

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)  # the suites' now, and `reboot`'s
# When the reservations the suites make expire, unless a test says otherwise: long after NOW.
HELD_UNTIL = NOW + timedelta(hours=1)
SQLITE, TABLES, FIRESTORE = "sqlite", "tables", "firestore"
BACKENDS = [SQLITE, pytest.param(TABLES, marks=pytest.mark.peer), pytest.param(FIRESTORE, marks=pytest.mark.peer)]


@dataclass
class Backend:
    name: str
    store: StateStore
    audit: AuditLog
    # Another client over the same state, as a second worker holds: races run on two of them.
    another_client: Callable[[], StateStore]


@contextmanager
def open_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The backend `request.param` names, on fresh state; every client it opened is closed after."""
    with ExitStack() as opened:
        if request.param == SQLITE:
            yield _sqlite_backend(request.getfixturevalue("tmp_path") / "functions.db", opened)
        elif request.param == TABLES:
            yield table_backend(request.getfixturevalue("azurite_tables"))
        else:
            request.getfixturevalue("firestore_emulator")
            yield _firestore_backend(new_project(), opened)


def _sqlite_backend(path: Path, opened: ExitStack) -> Backend:
    def another_client() -> StateStore:
        other = SqliteStore(path)
        opened.callback(other.close)
        return other

    store = SqliteStore(path)
    opened.callback(store.close)
    return Backend(SQLITE, store, store, another_client)


def table_backend(connection_string: str) -> Backend:
    """Stores on a state table and an audit table created for them."""
    service = TableServiceClient.from_connection_string(connection_string)
    state_table, audit_table = (f"t{uuid.uuid4().hex[:16]}" for _ in range(2))
    service.create_table(state_table)
    service.create_table(audit_table)

    def another_client() -> StateStore:
        other = TableServiceClient.from_connection_string(connection_string)
        return TableStateStore(other.get_table_client(state_table))

    return Backend(
        TABLES,
        TableStateStore(service.get_table_client(state_table)),
        TableAuditLog(service.get_table_client(audit_table)),
        another_client,
    )


def new_project() -> str:
    """A project of its own on the Firestore emulator: documents no other test sees."""
    return f"mbridge-test-{uuid.uuid4().hex[:12]}"


def _firestore_backend(project: str, opened: ExitStack) -> Backend:
    def client() -> firestore.Client:
        made = firestore.Client(project=project)
        opened.callback(made.close)
        return made

    def another_client() -> StateStore:
        return FirestoreStateStore(client())

    first = client()
    return Backend(FIRESTORE, FirestoreStateStore(first), FirestoreAuditLog(first), another_client)


def reboot(status: EventStatus, event_id: str = "E-REBOOT", vms: tuple[str, ...] = ("web-0", "web-1")) -> bytes:
    """The envelope of an Azure reboot, as the core's process takes it on a backend."""
    event: MaintenanceEvent = azure_event(
        kind=EventKind.REBOOT,
        status=status,
        event_id=event_id,
        reporter=vms[0],
        resources=vms,
        duration_seconds=-1,
        not_before=NOW + timedelta(minutes=15),
    )
    return encode(envelope_for_event(event, NOW))
