"""`mbridge audit list`: read an audit log by VM or by event, as JSON lines, oldest first.

The same command reads the three audit logs the function apps write:

    mbridge audit list --vm web-0                                  # the local host's SQLite
    mbridge audit list --table-endpoint https://ACCOUNT.table.core.windows.net --vm web-0   # Azure
    mbridge audit list --firestore-project my-project --event 5DD55B64-...                  # Google Cloud

Azure authenticates with DefaultAzureCredential (`az login`, a managed identity) and needs
Storage Table Data Reader on the audit table; Google with Application Default Credentials
(`gcloud auth application-default login`) and Firestore read access. The cloud libraries are
imported only when their source is chosen.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from agent.config import default_state_dir, env
from functions.core.ports import AuditRecord
from wire.errors import BridgeError
from wire.timefmt import format_rfc3339


class AuditReader(Protocol):
    def query(self, *, vm: str | None = None, event_id: str | None = None) -> Sequence[AuditRecord]: ...

    def query_since(self, since: datetime, *, most: int, vm: str | None = None) -> Sequence[AuditRecord]:
        """The records from `since` on, oldest first, at most `most` (`mbridge fleet`)."""
        ...


class SourceError(Exception):
    """The chosen audit log cannot be opened; the message says what to pass."""


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="audit_command", metavar="COMMAND")
    actions.required = True
    listing = actions.add_parser("list", help="print audit records as JSON lines, oldest first")
    listing.add_argument("--vm", help="only records about this VM")
    listing.add_argument("--event", help="only records of this event id (case-insensitive)")
    add_source_flags(listing)


def add_source_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that choose the audit log (`open_reader`): the local database by default."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--db",
        default=None,
        help="the local function host's database [MBRIDGE_FUNCTIONS_DB, default <state-dir>/functions.db]",
    )
    source.add_argument("--table-endpoint", help="Azure: the Table service URL; signs in with DefaultAzureCredential")
    source.add_argument(
        "--table-connection-string", help="Azure: a Table connection string instead (Azurite, local runs)"
    )
    source.add_argument("--firestore-project", help="Google Cloud: the project of the Firestore database")
    parser.add_argument(
        "--audit-table",
        default=env("MBRIDGE_AUDIT_TABLE", "mbridgeaudit"),
        help="Azure: the audit table [MBRIDGE_AUDIT_TABLE, default mbridgeaudit]",
    )
    parser.add_argument(
        "--firestore-database",
        default=env("MBRIDGE_FIRESTORE_DATABASE", "(default)"),
        help="Google Cloud: the database [MBRIDGE_FIRESTORE_DATABASE, default (default)]",
    )
    parser.add_argument(
        "--firestore-prefix",
        default=env("MBRIDGE_FIRESTORE_COLLECTION_PREFIX", "mbridge_"),
        help="Google Cloud: the collection prefix [MBRIDGE_FIRESTORE_COLLECTION_PREFIX, default mbridge_]",
    )


def audit_line(record: AuditRecord) -> dict[str, Any]:
    """One audit record as `mbridge audit list` prints it."""
    return {
        "time": format_rfc3339(record.time),
        "kind": record.kind,
        "event_id": record.event_id,
        "vm": record.vm,
        "status": record.status,
        "action": record.action,
        "rule": record.rule,
        "at": format_rfc3339(record.at) if record.at else None,
        "reason": record.reason,
        "envelope_id": record.envelope_id,
        "detail": record.detail,
        "trace_id": record.trace_id,
    }


def run(args: argparse.Namespace) -> int:
    records = read_log(args, lambda reader: reader.query(vm=args.vm, event_id=args.event), "mbridge audit")
    if records is None:
        return 2
    for record in records:
        print(json.dumps(audit_line(record)))
    return 0


def read_log(
    args: argparse.Namespace, read: Callable[[AuditReader], Sequence[AuditRecord]], program: str
) -> Sequence[AuditRecord] | None:
    """What `read` reads from the audit log the flags name; None when it cannot be read (said on stderr)."""
    try:
        reader, close = open_reader(args)
    except SourceError as error:
        print(f"{program}: {error}", file=sys.stderr)
        return None
    try:
        return read(reader)
    except BridgeError as error:  # unreachable, missing role or index: the adapters' messages say which
        print(f"{program}: {error}", file=sys.stderr)
        return None
    finally:
        close()


def open_reader(args: argparse.Namespace) -> tuple[AuditReader, Any]:
    """The audit log the flags name, and how to close it."""
    if args.table_endpoint or args.table_connection_string:
        return _table_reader(args), lambda: None
    if args.firestore_project:
        return _firestore_reader(args), lambda: None
    return _sqlite_reader(args)


def _sqlite_reader(args: argparse.Namespace) -> tuple[AuditReader, Any]:
    from functions.local_app.store import SqliteStore

    db = args.db or env("MBRIDGE_FUNCTIONS_DB")
    path = Path(db) if db else default_state_dir() / "functions.db"
    if not path.exists():
        raise SourceError(
            f"no audit database at {path}; pass --db, or --table-endpoint / --firestore-project for a cloud audit log"
        )
    store = SqliteStore(path)
    return store, store.close


def _table_reader(args: argparse.Namespace) -> AuditReader:
    try:
        from azure.data.tables import TableClient

        from functions.azure_app.tables import TableAuditLog
    except ImportError as error:
        raise SourceError(
            f"the Azure libraries are missing ({error}): install maintenance-bridge[functions-azure]"
        ) from error
    if args.table_connection_string:
        table = TableClient.from_connection_string(args.table_connection_string, table_name=args.audit_table)
    else:
        from azure.identity import DefaultAzureCredential

        table = TableClient(args.table_endpoint, table_name=args.audit_table, credential=DefaultAzureCredential())
    return TableAuditLog(table)


def _firestore_reader(args: argparse.Namespace) -> AuditReader:
    try:
        from google.cloud import firestore

        from functions.gcp_app.firestore_audit import FirestoreAuditLog
    except ImportError as error:
        raise SourceError(
            f"the Google libraries are missing ({error}): install maintenance-bridge[functions-gcp]"
        ) from error
    client = firestore.Client(project=args.firestore_project, database=args.firestore_database)
    return FirestoreAuditLog(client, prefix=args.firestore_prefix, database=args.firestore_database)
