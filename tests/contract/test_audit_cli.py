"""`mbridge audit list` reads the three audit logs the function apps write: the local host's
SQLite, Azure Table Storage (Azurite here) and Firestore (its emulator here).

GIVEN records appended through each store's own AuditLog adapter
WHEN  `mbridge audit list` is run with that store's flags, by VM and by event
THEN  it prints the matching records as JSON lines, oldest first, with their detail.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from functions.core.ports import AuditLog, AuditRecord
from functions.core.process import Deps
from functions.local_app.store import SqliteStore
from mbridge.cli import main
from tests.kit import FakeClock
from tests.unit.functions.test_central import SET, SILENT_AFTER, World
from tests.unit.functions.test_trust import opened
from wire.model import EventStatus

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
EVENT = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
RECORDS = [
    AuditRecord(T0, "event", "env-1", EVENT, "web-0", status="scheduled", action="none"),
    AuditRecord(T0 + timedelta(seconds=1), "decision", "env-1", EVENT, "web-0", action="drain", rule="azure-scheduled"),
    AuditRecord(T0 + timedelta(seconds=2), "decision", "env-1", EVENT, "web-1", action="drain", rule="azure-scheduled"),
    AuditRecord(
        T0 + timedelta(seconds=3),
        "action",
        "env-1",
        EVENT,
        "web-0",
        action="approve",
        at=T0 + timedelta(seconds=33),
        detail={"command_id": "cmd-1"},
    ),
    AuditRecord(T0 + timedelta(seconds=4), "event", "env-2", "OTHER-EVENT", "web-0", status="scheduled"),
]


@dataclass
class AuditSource:
    audit: AuditLog
    flags: list[str]


def sqlite_source(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[AuditSource]:
    store = SqliteStore(tmp_path / "functions.db")
    yield AuditSource(store, ["--db", str(tmp_path / "functions.db")])
    store.close()


def table_source(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[AuditSource]:
    from azure.data.tables import TableServiceClient

    from functions.azure_app.tables import TableAuditLog

    connection = request.getfixturevalue("azurite_tables")
    table = f"audit{uuid.uuid4().hex[:12]}"
    TableServiceClient.from_connection_string(connection).create_table(table)
    flags = ["--table-connection-string", connection, "--audit-table", table]
    yield AuditSource(
        TableAuditLog(TableServiceClient.from_connection_string(connection).get_table_client(table)), flags
    )


def firestore_source(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[AuditSource]:
    from google.cloud import firestore

    from functions.gcp_app.firestore_audit import FirestoreAuditLog

    request.getfixturevalue("firestore_emulator")
    project = f"mbridge-test-{uuid.uuid4().hex[:12]}"
    client = firestore.Client(project=project)
    yield AuditSource(FirestoreAuditLog(client), ["--firestore-project", project])
    client.close()  # type: ignore[no-untyped-call]  # the library leaves it unannotated


SOURCES: dict[str, Callable[[Path, pytest.FixtureRequest], Iterator[AuditSource]]] = {
    "sqlite": sqlite_source,
    "table": table_source,
    "firestore": firestore_source,
}


@pytest.fixture(
    params=["sqlite", pytest.param("table", marks=pytest.mark.peer), pytest.param("firestore", marks=pytest.mark.peer)]
)
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AuditSource]:
    yield from SOURCES[request.param](tmp_path, request)


def audit_list(flags: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, Any]], str]:
    code = main(["audit", "list", *flags])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def test_by_vm_and_by_event(source: AuditSource, capsys: pytest.CaptureFixture[str]) -> None:
    for record in RECORDS:
        source.audit.append(record)

    code, by_vm, _ = audit_list([*source.flags, "--vm", "web-0"], capsys)
    assert code == 0
    assert [(line["kind"], line["event_id"], line["action"]) for line in by_vm] == [
        ("event", EVENT, "none"),
        ("decision", EVENT, "drain"),
        ("action", EVENT, "approve"),
        ("event", "OTHER-EVENT", ""),
    ]
    assert by_vm[2]["at"] == "2026-03-01T12:00:33Z"
    assert by_vm[2]["detail"] == {"command_id": "cmd-1"}

    code, by_event, _ = audit_list([*source.flags, "--event", EVENT.lower()], capsys)
    assert code == 0
    assert [(line["vm"], line["action"]) for line in by_event] == [
        ("web-0", "none"),
        ("web-0", "drain"),
        ("web-1", "drain"),
        ("web-0", "approve"),
    ]


def test_a_missing_local_database_says_what_to_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, err = audit_list(["--db", str(tmp_path / "nothing.db")], capsys)

    assert code == 2
    assert lines == []
    assert "no audit database at" in err
    assert "--table-endpoint / --firestore-project" in err


def test_sources_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", "list", "--db", "x.db", "--firestore-project", "p"])

    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@dataclass
class LoggedWorld(World):
    """test_central.py's world, whose core writes its audit records to another log (a source's)."""

    log: AuditLog | None = None

    def deps(self) -> Deps:
        return replace(super().deps(), audit=self.log or self.store)


def test_the_fleet_view_reads_every_source(source: AuditSource, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN the core's records in the source's audit log, now: web-0's Reboot reported by its agent
    # (drained, approved), web-1's by the control plane only (its agent silent), both not ended
    with opened(LoggedWorld, SET) as world:
        world.log, world.clock = source.audit, FakeClock(datetime.now(timezone.utc))
        world.policy = replace(world.policy, silent_agents="drain")
        world.agent(EventStatus.SCHEDULED, vm="web-0")
        world.centre(EventStatus.SCHEDULED, vms=("web-1",))
        world.clock.advance(SILENT_AFTER)
        world.sweep()

    # WHEN `mbridge fleet` reads it with the source's flags, as JSON and as a table
    code = main(["fleet", *source.flags, "--since", "1h", "--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    table_code = main(["fleet", *source.flags, "--since", "1h", "--vm", "web-1"])
    table = capsys.readouterr().out.splitlines()

    # THEN each VM's part is one row, said as the core did it
    assert (code, table_code) == (0, 0)
    assert [(row["vm"], row["source"], row["drained"], row["approved"], row["silent"]) for row in rows] == [
        ("web-0", "agent", "yes", "sent", False),
        ("web-1", "centre", "yes", "sent", True),
    ]
    assert [line.split()[0] for line in table] == ["VM", "web-1"]
