"""`mbridge`: the one console script. Each subcommand lives in its own module and is
imported only when chosen, so the agent never pays for what it does not run."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mbridge",
        description="Forward cloud VM maintenance notices to a bus, and rehearse them locally.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    from agent.simulator import cli as simulate_cli

    simulate = commands.add_parser(
        "simulate",
        help="serve a local Azure IMDS / GCE metadata simulator",
        description=(
            "Serve a faithful local metadata service (Azure Scheduled Events or GCE "
            "maintenance-event) for tests, demos and rehearsals. Prints one base URL per VM first."
        ),
    )
    simulate_cli.configure(simulate)
    simulate.set_defaults(run=simulate_cli.run)

    from agent import main as agent_main

    agent = commands.add_parser(
        "agent",
        help="watch this VM's metadata service and forward every maintenance change",
        description=(
            "Watch Azure Scheduled Events or GCE maintenance metadata, publish every change as a "
            "CloudEvent, and carry approvals back. Every flag has an MBRIDGE_* environment variable."
        ),
    )
    agent_main.configure(agent)
    agent.set_defaults(run=agent_main.run)

    from agent import approve_cli

    approve = commands.add_parser(
        "approve",
        help="ask a VM's agent to approve an Azure scheduled event, and wait for its answer",
        description=(
            "Send an approve command to one VM through the bus. The agent re-checks the event against "
            "IMDS before POSTing. Exit 0 accepted, 1 rejected (reason printed), 2 no answer."
        ),
    )
    approve_cli.configure(approve)
    approve.set_defaults(run=approve_cli.run)

    from functions.local_app import audit_cli, replay

    replaying = commands.add_parser(
        "replay",
        help="run recorded envelopes through the policy and print the actions it takes",
        description="One JSON line per action (time, event_id, status, vm, action, at, reason), "
        "on a virtual clock taken from the envelopes; duplicates take no new action.",
    )
    replay.configure(replaying)
    replaying.set_defaults(run=replay.run)

    auditing = commands.add_parser("audit", help="read the local audit log")
    audit_cli.configure(auditing)
    auditing.set_defaults(run=audit_cli.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    exit_code: int = args.run(args)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
