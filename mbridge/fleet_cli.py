"""`mbridge fleet`: upcoming and running maintenance across the fleet, from the audit log.

One row per (VM, event), built from the audit records of a window (`--since`, default the last 7
days) by `functions.core.fleet`: who reported it (agent, centre, both), whether the VM was drained,
whether the event was approved, how it ended, whether the VM's agent was found silent. The same
audit logs and flags as `mbridge audit list`:

    mbridge fleet                                                          # the local host's SQLite
    mbridge fleet --table-endpoint https://ACCOUNT.table.core.windows.net  # Azure
    mbridge fleet --firestore-project my-project --all --json              # Google Cloud

At most `--limit` records are read: a window that holds more is refused rather than shown in part
(a row missing its end would show an event as still running).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from functions.core.fleet import FleetRow, FleetView, fleet_view
from mbridge.audit_cli import add_source_flags, read_log
from mbridge.text_table import aligned, cell, short_id
from wire.timefmt import format_rfc3339, parse_rfc3339

DEFAULT_SINCE = "7d"
DEFAULT_LIMIT = 20_000
SHORT_EVENT_ID = 8  # characters of an event id without --wide (an Azure GUID's first group)
# The widest a column is printed, by name; what is longer is cut with "…" (--wide: wider).
WIDEST = {"VM": 40, "EVENT": 40, "KIND": 20}
WIDEST_WIDE = {"VM": 80, "EVENT": 80, "KIND": 40}
HEADERS = ("VM", "EVENT", "KIND", "NOT BEFORE", "STATUS", "SOURCE", "DRAINED", "APPROVED", "ENDED", "SILENT")
_AGO = re.compile(r"^(\d{1,6})([mhd])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vm", help="only this VM")
    parser.add_argument(
        "--since",
        default=DEFAULT_SINCE,
        help=f"only records from then on: an RFC 3339 time, or a span ago as 30m, 12h, 7d [default {DEFAULT_SINCE}]",
    )
    parser.add_argument("--all", action="store_true", help="also the events that ended")
    parser.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table: aligned columns for people; json: one JSON line per row, full values, for automation "
        "[default table, into a pipe too]",
    )
    parser.add_argument("--json", action="store_true", help="the same as --format json")
    parser.add_argument("--wide", action="store_true", help="full event ids and wider columns")
    parser.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"the most audit records read; a window with more is refused [default {DEFAULT_LIMIT}]",
    )
    add_source_flags(parser)


def run(args: argparse.Namespace) -> int:
    now = datetime.now(timezone.utc)
    try:
        since = parse_since(args.since, now)
    except ValueError as error:
        print(f"mbridge fleet: --since {args.since!r}: {error}", file=sys.stderr)
        return 2
    if args.limit < 1:
        print("mbridge fleet: --limit must be at least 1", file=sys.stderr)
        return 2
    records = read_log(args, lambda reader: reader.query_since(since, most=args.limit + 1, vm=args.vm), "mbridge fleet")
    if records is None:
        return 2
    if len(records) > args.limit:
        print(
            f"mbridge fleet: more than {args.limit} audit records since {format_rfc3339(since)}: the view would "
            "be incomplete, so none is shown. Pass a later --since, a --vm, or a larger --limit.",
            file=sys.stderr,
        )
        return 2
    view = fleet_view(records)
    rows = [row for row in view.rows if args.all or not row.ended]
    if args.json or args.format == "json":
        for row in rows:
            print(json.dumps(row_line(view, row), sort_keys=True))
    else:
        print(table(view, rows, wide=args.wide), end="")
    return 0


def parse_since(text: str, now: datetime) -> datetime:
    """`--since`: an RFC 3339 time, or a span before `now` (30m, 12h, 7d)."""
    ago = _AGO.match(text.strip())
    if ago:
        return now - timedelta(**{_UNITS[ago.group(2)]: int(ago.group(1))})
    try:
        return parse_rfc3339(text.strip())
    except ValueError as error:
        raise ValueError(f"not an RFC 3339 time nor a span such as 30m, 12h, 7d ({error})") from error


def row_line(view: FleetView, row: FleetRow) -> dict[str, Any]:
    """One row as `--json` prints it."""
    return {
        "vm": row.vm,
        "event_id": row.event_id,
        "cloud": row.cloud,
        "kind": row.kind,
        "not_before": format_rfc3339(row.not_before) if row.not_before else None,
        "status": row.status,
        "source": row.source,
        "drained": row.drained,
        "approved": view.approval(row),
        "ended": row.ended,
        "silent": row.silent,
        "last_record": format_rfc3339(row.last) if row.last else None,
    }


def table(view: FleetView, rows: Sequence[FleetRow], *, wide: bool = False) -> str:
    """The rows as a plain text table, its columns aligned; every value shown safely (`cell`)."""
    widest = WIDEST_WIDE if wide else WIDEST
    cells = [list(HEADERS)]
    for row in rows:
        event_id = row.event_id if wide else short_id(row.event_id, SHORT_EVENT_ID)
        values = [
            row.vm,
            event_id,
            row.kind,
            format_rfc3339(row.not_before) if row.not_before else "",
            row.status,
            row.source,
            row.drained,
            view.approval(row),
            row.ended,
            "yes" if row.silent else "",
        ]
        cells.append([cell(value, widest.get(header, 20)) for header, value in zip(HEADERS, values)])
    return aligned(cells)
