"""`mbridge recover`: list the VMs still drained, and put one back by hand when no report will.

    mbridge recover list                                        # what is still out of its pools
    mbridge recover restore --vm web-0 --event 5DD55B64-... --reason "completion dead-lettered, ticket 123"

It runs the function app's own code (functions.core.recovery) on the deployment's own state, built
from the same settings the app reads: `--app azure` the Azure app's environment variables
(functions/azure_app/wiring.build_deps, signed in with DefaultAzureCredential: the operator's
`az login`), `--app gcp` the Cloud Function's (functions/gcp_app/wiring.build_deps, Application
Default Credentials), `--app local` the local function host's SQLite store and pool (the demo's
work directory). The operator's identity needs what the function app's has on the state, audit
log and load balancer (docs/operations.md#recovering-a-vm-left-drained).

Every `restore`, done or refused, is audited (a record of kind `recovery` naming `--by` and the
reason); `list` only reads.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agent.config import default_state_dir, env
from functions.core.invocation import Deps
from functions.core.recovery import Recovery, RecoveryRefusedError, StillDrained, recover, still_drained
from wire.errors import BridgeError

EXIT_DONE = 0
EXIT_NOT_DONE = 1  # refused, or the load balancer failed: the drain record is kept
EXIT_CONFIG = 2  # the settings or the flags: nothing was read or changed
APPS = ("local", "azure", "gcp")


class RecoverConfigError(Exception):
    """The deployment's state cannot be opened as asked; the message says what to pass."""


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="recover_command", metavar="COMMAND")
    actions.required = True
    listing = actions.add_parser(
        "list",
        help="print every VM still drained, as JSON lines",
        description="Print one JSON line per VM this system drained and has not put back: its event, since "
        "when, the event's kind and NotBefore, and whether a report of the event's end was processed.",
    )
    _add_app_arguments(listing)
    restore = actions.add_parser(
        "restore",
        help="put one VM back for one event, as its completion would have; audited",
        description="End the VM's part of the event through the completion's own path: put back what its drain "
        "record names, drop the record, free the budget slot and admit waiting events. Refused when the event's "
        "end was never seen, unless --force. Exit 0 done, 1 refused or not put back (the record is kept), "
        "2 a configuration error.",
    )
    restore.add_argument("--vm", required=True, help="the VM, as `mbridge recover list` names it")
    restore.add_argument("--event", required=True, help="the event id (or cloud:id), as `mbridge recover list` shows")
    restore.add_argument(
        "--reason", required=True, help="why, for the audit log (a ticket, 'completion dead-lettered', ...)"
    )
    restore.add_argument(
        "--force",
        action="store_true",
        help="put the VM back although no report of the event's end was processed: only once you checked that the "
        "event is over (the VM would otherwise take traffic during its maintenance)",
    )
    restore.add_argument(
        "--by",
        default=None,
        help="who runs it, for the audit log [default: the local user@host]",
    )
    _add_app_arguments(restore)


def _add_app_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--app",
        choices=APPS,
        default=env("MBRIDGE_RECOVER_APP", "local"),
        help="whose state: the Azure or Google Cloud function app's (from its settings in this environment: the "
        "same MBRIDGE_* variables), or the local host's [MBRIDGE_RECOVER_APP, default local]",
    )
    local = parser.add_argument_group("local", "the local function host (the demo's work directory)")
    local.add_argument("--db", default=None, help="its store [MBRIDGE_FUNCTIONS_DB, default <state-dir>/functions.db]")
    local.add_argument("--pool", default=None, help="its load-balancer pool [default: pool.db beside --db]")
    local.add_argument(
        "--bus-path", default=None, help="its bus, for the commands of admitted events [default: bus.db beside --db]"
    )


def run(args: argparse.Namespace, clock: Callable[[], datetime] | None = None) -> int:
    now = clock or (lambda: datetime.now(timezone.utc))
    try:
        with _opened(args) as deps:
            if args.recover_command == "list":
                for entry in still_drained(deps.store):
                    print(json.dumps(listing_line(entry)))
                return EXIT_DONE
            request = Recovery(
                vm=args.vm, event_id=args.event, operator=args.by or _local_user(), reason=args.reason, force=args.force
            )
            outcome = recover(deps, request, now())
    except RecoverConfigError as error:
        print(f"mbridge recover: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except RecoveryRefusedError as error:
        print(f"mbridge recover: {error}", file=sys.stderr)
        return EXIT_NOT_DONE
    except BridgeError as error:  # a setting, a role, the load balancer: the adapters' messages say which
        print(f"mbridge recover: {error}", file=sys.stderr)
        return EXIT_NOT_DONE
    for taken in outcome.actions:
        print(f"{taken.action.value} {taken.vm}: {taken.reason}")
    return EXIT_DONE


def listing_line(entry: StillDrained) -> dict[str, Any]:
    """One VM still drained as `mbridge recover list` prints it."""
    return {
        "vm": entry.vm,
        "cloud": entry.cloud,
        "event_id": entry.event_id,
        "kind": entry.kind,
        "state": entry.state,
        "drained_at": entry.drained_at,
        "not_before": entry.not_before,
        "end_seen": entry.ended is not None,
        "ended": None if entry.ended is None else {"status": entry.ended.status.value, "time": entry.ended.time},
    }


def _local_user() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"


@contextmanager
def _opened(args: argparse.Namespace) -> Iterator[Deps]:
    """The app's Deps as its settings build them; closed after."""
    if args.app == "azure":
        yield _azure_deps()
    elif args.app == "gcp":
        yield _gcp_deps()
    else:
        with ExitStack() as opened:
            yield _local_deps(args, opened)


def _azure_deps() -> Deps:
    try:
        from functions.azure_app.settings import Settings, SettingsError
        from functions.azure_app.wiring import build_deps
    except ImportError as error:
        raise RecoverConfigError(
            f"the Azure libraries are missing ({error}): install maintenance-bridge[functions-azure]"
        ) from error
    try:
        return build_deps(Settings.from_env(os.environ))
    except SettingsError as error:
        raise RecoverConfigError(f"{error} (the function app's settings, in this environment)") from error


def _gcp_deps() -> Deps:
    try:
        from functions.gcp_app.settings import Settings, SettingsError
        from functions.gcp_app.wiring import build_deps
    except ImportError as error:
        raise RecoverConfigError(
            f"the Google libraries are missing ({error}): install maintenance-bridge[functions-gcp]"
        ) from error
    try:
        return build_deps(Settings.from_env(os.environ))
    except SettingsError as error:
        raise RecoverConfigError(f"{error} (the Cloud Function's settings, in this environment)") from error


def _local_deps(args: argparse.Namespace, opened: ExitStack) -> Deps:
    from functions.core.policy import PolicyError, load_policy
    from functions.local_app.balancer import LocalPool
    from functions.local_app.commands import LocalCommandSender
    from functions.local_app.store import SqliteStore
    from wire.signing import load_private_key, sign_command
    from wire.transports.local import LocalBus

    db = Path(args.db or env("MBRIDGE_FUNCTIONS_DB") or default_state_dir() / "functions.db")
    pool, bus = Path(args.pool or db.parent / "pool.db"), Path(args.bus_path or db.parent / "bus.db")
    for path, flag in ((db, "--db"), (pool, "--pool"), (bus, "--bus-path")):
        if not path.exists():
            raise RecoverConfigError(f"no local function host's file at {path}: pass {flag}")
    try:
        policy = load_policy(env("MBRIDGE_POLICY"))
    except PolicyError as error:
        raise RecoverConfigError(f"MBRIDGE_POLICY: {error}") from error
    key_source = env("MBRIDGE_SIGNING_KEY")
    key = None if key_source is None else load_private_key(key_source)
    store, balancer, local_bus = SqliteStore(db), LocalPool(pool), LocalBus(bus)
    for closing in (store.close, balancer.close, local_bus.close):
        opened.callback(closing)
    return Deps(
        store=store,
        balancer=balancer,
        sender=LocalCommandSender(local_bus),
        audit=store,
        policy=policy,
        signer=None if key is None else (lambda command: sign_command(command, key)),
    )
