"""`mbridge audit list`: read the local function host's audit log, by VM or by event."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agent.config import default_state_dir, env
from functions.core.timefmt import format_rfc3339
from functions.local_app.store import SqliteStore


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="audit_command", metavar="COMMAND")
    actions.required = True
    listing = actions.add_parser("list", help="print audit records as JSON lines, oldest first")
    listing.add_argument("--vm", help="only records about this VM")
    listing.add_argument("--event", help="only records of this event id (case-insensitive)")
    listing.add_argument(
        "--db",
        default=env("MBRIDGE_FUNCTIONS_DB"),
        help="the local function host's database [MBRIDGE_FUNCTIONS_DB, default <state-dir>/functions.db]",
    )


def run(args: argparse.Namespace) -> int:
    path = Path(args.db) if args.db else default_state_dir() / "functions.db"
    if not path.exists():
        print(f"mbridge audit: no audit database at {path}; pass --db", file=sys.stderr)
        return 2
    store = SqliteStore(path)
    try:
        for record in store.query(vm=args.vm, event_id=args.event):
            line = {
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
            }
            print(json.dumps(line))
    finally:
        store.close()
    return 0
