"""`mbridge commands-entity`: the commands queue or topic that carries a VM's commands when a
deployment spreads them over several (wire.shards).

Terraform computes it itself; the Bicep cannot (it has no SHA-256), so whoever deploys a VM's
commands subscription with infra/azure/modules/vm-commands-subscription.bicep or an entry of
main.bicep's commandsSubscriptionVms (its `topic`), or points an agent of the queue mode at its
queue, asks this command which entity that is.
"""

from __future__ import annotations

import argparse
import sys

from agent.config import env
from wire.shards import entity_for, parse_shards

DEFAULT_BASE = "maintenance-commands"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vm",
        action="append",
        required=True,
        metavar="NAME",
        help="the VM's name as its agent reports it (repeat for several: then each line is NAME ENTITY)",
    )
    parser.add_argument(
        "--shards",
        default=env("MBRIDGE_COMMANDS_SHARDS"),
        metavar="N",
        help="how many commands entities the deployment has (commandsShards / commands_shards) "
        "[MBRIDGE_COMMANDS_SHARDS]",
    )
    parser.add_argument(
        "--base",
        default=DEFAULT_BASE,
        help=f"the name of the first commands queue or topic (default {DEFAULT_BASE})",
    )


def run(args: argparse.Namespace) -> int:
    if args.shards is None:
        print("mbridge commands-entity: give --shards N (or MBRIDGE_COMMANDS_SHARDS)", file=sys.stderr)
        return 2
    try:
        shards = parse_shards(str(args.shards))
    except ValueError as exc:
        print(f"mbridge commands-entity: --shards: {exc}", file=sys.stderr)
        return 2
    if not all(vm.strip() for vm in args.vm):
        print("mbridge commands-entity: --vm takes a VM's name, not an empty one", file=sys.stderr)
        return 2
    lines = [(vm, entity_for(args.base, vm, shards)) for vm in args.vm]
    if len(lines) == 1:
        print(lines[0][1])
    else:
        for vm, entity in lines:
            print(vm, entity)
    return 0
