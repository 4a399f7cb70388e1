"""`mbridge audit list`: read an audit log by VM or by event, oldest first: a table for people on a
terminal, JSON lines for scripts.

The same command reads the three audit logs the function apps write:

    mbridge audit list --vm web-0                                  # the local host's SQLite
    mbridge audit list --table-endpoint https://ACCOUNT.table.core.windows.net --vm web-0   # Azure
    mbridge audit list --firestore-project my-project --event 5DD55B64-...                  # Google Cloud

`--trace` is one maintenance of one VM: the records with that trace id (`trace_id`), with `--vm`
and `--event` applied to them; the log is asked for the trace alone (docs/operations.md).

`--vm` is the VM's whole story: every record that names it (functions.core.audit_codec.names),
also those filed under another VM, such as a report a compromised VM sent about it.

What it prints: an aligned table when standard output is a terminal, fitted to its width (`--wide`:
every value whole); JSON lines otherwise, one record each with every field, so that a script that
pipes the output keeps reading JSON. `--format` chooses either way; a script should pass
`--format json`, as its output may be a terminal some day (ssh -t, script, expect).

Exit statuses: 0 records printed; 2 the flags are wrong or the log cannot be read (said on
stderr); `NO_RECORD` (3) no record matches (said on stderr: a VM no record names is most often
a misspelt one). 1 is Python's own for an unexpected failure, so it is not used.

Azure authenticates with DefaultAzureCredential (`az login`, a managed identity) and needs
Storage Table Data Reader on the audit table; Google with Application Default Credentials
(`gcloud auth application-default login`) and Firestore read access. The cloud libraries are
imported only when their source is chosen.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from agent.config import default_state_dir, env
from functions.core.audit_codec import also_named, names
from functions.core.ports import AuditRecord
from mbridge.text_table import aligned, cell, short_id, width
from mbridge.trace_flag import trace_id
from wire.errors import BridgeError
from wire.timefmt import format_rfc3339

NO_RECORD = 3  # the exit status when no record matches (see the module docstring)
TABLE, JSON = "table", "json"
# The widest a column is printed, by header; what is longer is cut with "…". REASON, last, takes
# what a terminal leaves of its width, at least MIN_REASON columns (in a pipe, WIDEST's).
WIDEST = {"TIME": 24, "EVENT": 9, "VM": 40, "KIND": 16, "STATUS": 12, "ACTION": 20, "ALSO NAMES": 40, "REASON": 100}
MIN_REASON = 20
WHOLE = 100_000  # --wide: more than any value an audit record keeps


class AuditReader(Protocol):
    def query(self, *, vm: str | None = None, event_id: str | None = None) -> Sequence[AuditRecord]: ...

    def query_naming(self, vm: str, *, event_id: str | None = None) -> Sequence[AuditRecord]:
        """The records that name `vm` wherever they are filed, of one event or all, oldest first."""
        ...

    def query_since(self, since: datetime, *, most: int, vm: str | None = None) -> Sequence[AuditRecord]:
        """The records from `since` on, oldest first, at most `most` (`mbridge fleet`)."""
        ...

    def query_trace(self, trace_id: str) -> Sequence[AuditRecord]:
        """The records of one trace, oldest first (`--trace`)."""
        ...


class SourceError(Exception):
    """The chosen audit log cannot be opened; the message says what to pass."""


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="audit_command", metavar="COMMAND")
    actions.required = True
    listing = actions.add_parser(
        "list",
        help="print audit records, oldest first: a table on a terminal, JSON lines otherwise",
        description="Print audit records, oldest first: an aligned table when standard output is a terminal, "
        "JSON lines (one record each, every field) otherwise or with --format json. Exit 0 records printed, "
        f"2 wrong flags or a log that cannot be read, {NO_RECORD} no record matches (said on stderr).",
    )
    listing.add_argument(
        "--vm", help="only the records that name this VM: filed under it, or naming it (a report about several VMs)"
    )
    listing.add_argument("--event", help="only records of this event id (case-insensitive)")
    listing.add_argument(
        "--trace",
        type=trace_id,
        help="only the records of this trace: one maintenance of one VM (32 lowercase hex, a record's trace_id)",
    )
    listing.add_argument(
        "--format",
        choices=(TABLE, JSON),
        default=None,
        help="table: aligned columns for people; json: one JSON line per record, for scripts "
        "[default table on a terminal, json otherwise]",
    )
    listing.add_argument("--wide", action="store_true", help="table: every value whole, full event ids, the rule")
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
    def read(reader: AuditReader) -> Sequence[AuditRecord]:
        if args.trace is not None:
            return of_trace(reader, args.trace, vm=args.vm, event_id=args.event)
        if args.vm is None:
            return reader.query(event_id=args.event)
        return reader.query_naming(args.vm, event_id=args.event)

    records = read_log(args, read, "mbridge audit")
    if records is None:
        return 2
    if not records:
        print(f"mbridge audit: {nothing_found(args.vm, args.event, args.trace)}", file=sys.stderr)
        return NO_RECORD
    terminal = sys.stdout.isatty()
    if (args.format or (TABLE if terminal else JSON)) == JSON:
        for record in records:
            print(json.dumps(audit_line(record)))
    else:
        columns = shutil.get_terminal_size().columns if terminal else None
        print(table(records, wide=args.wide, columns=columns), end="")
    return 0


def of_trace(reader: AuditReader, trace: str, *, vm: str | None, event_id: str | None) -> Sequence[AuditRecord]:
    """The records of one trace; of those, the ones that name `vm` and are of `event_id` when given.
    The log is asked for the trace alone (its records are one maintenance of one VM, a few dozen);
    the other filters are applied here."""
    return [
        record
        for record in reader.query_trace(trace)
        if (vm is None or names(record, vm)) and (event_id is None or record.event_id.lower() == event_id.lower())
    ]


def nothing_found(vm: str | None, event_id: str | None, trace: str | None = None) -> str:
    """What stderr says when no record matches."""
    if trace is not None:
        of_event = f" of event {event_id!r}" if event_id is not None else ""
        naming = f" names VM {vm!r}" if vm is not None else ""
        return f"no audit record of trace {trace}{of_event}{naming}"
    if vm is not None and event_id is not None:
        return f"no audit record of event {event_id!r} names VM {vm!r}"
    if vm is not None:
        return f"no audit record names VM {vm!r} (none is filed under it, none lists it): check its spelling"
    if event_id is not None:
        return f"no audit record of event {event_id!r}"
    return "the audit log holds no record"


def table(records: Sequence[AuditRecord], *, wide: bool = False, columns: int | None = None) -> str:
    """The records as an aligned table, one line each: when, which event, the VM it is filed under,
    what it is (KIND, the event's STATUS, the ACTION taken or answered), the other VMs it names, and
    why. REASON takes what `columns` (a terminal's width) leaves of it; `wide` shows every value whole
    and adds the policy's RULE."""
    others = [",".join(also_named(record)) for record in records]
    headers = ["TIME", "EVENT", "VM", "KIND", "STATUS", "ACTION"]
    headers += ["ALSO NAMES"] if any(others) else []  # a column no record fills is left out
    headers += ["RULE", "REASON"] if wide else ["REASON"]
    rows = [_values(record, named, wide=wide) for record, named in zip(records, others)]
    most = dict.fromkeys(headers, WHOLE) if wide else dict(WIDEST)
    cells = [[cell(row[header], most[header]) for header in headers[:-1]] for row in rows]
    if columns is not None and not wide:
        # What the other columns take, with the two spaces between each: the rest is the reason's.
        taken = sum(
            max([width(header), *(width(line[n]) for line in cells)]) + 2 for n, header in enumerate(headers[:-1])
        )
        most["REASON"] = max(MIN_REASON, columns - taken)
    for line, row in zip(cells, rows):
        line.append(cell(row["REASON"], most["REASON"]))
    return aligned([headers, *cells])


def _values(record: AuditRecord, named: str, *, wide: bool) -> dict[str, str]:
    """One record's line of the table, by header."""
    return {
        "TIME": format_rfc3339(record.time if wide else record.time.replace(microsecond=0)),
        "EVENT": record.event_id if wide else short_id(record.event_id),
        "VM": record.vm,
        "KIND": record.kind,
        "STATUS": record.status,
        "ACTION": record.action,
        "ALSO NAMES": named,
        "RULE": record.rule,
        "REASON": _reason(record),
    }


def _reason(record: AuditRecord) -> str:
    """Why, and for an approval when it runs."""
    if record.at is None:
        return record.reason
    when = f"at {format_rfc3339(record.at)}"
    return f"{when}: {record.reason}" if record.reason else when


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
