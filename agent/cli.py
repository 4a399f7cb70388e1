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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    exit_code: int = args.run(args)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
