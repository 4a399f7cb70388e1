"""`mbridge`: the one console script. Only the chosen subcommand's module is imported, so the
agent on a VM never loads the simulator, the function core's stores or anything else it does
not run (and `mbridge --help` imports none of them)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NamedTuple

from wire.version import version


class Command(NamedTuple):
    module: str  # has configure(parser) and run(args) -> exit code
    help: str
    description: str


COMMANDS = {
    "simulate": Command(
        "simulator.cli",
        "serve a local Azure IMDS / GCE metadata simulator",
        "Serve a faithful local metadata service (Azure Scheduled Events or GCE maintenance-event) for "
        "tests, demos and rehearsals. Prints one base URL per VM first.",
    ),
    "agent": Command(
        "agent.main",
        "watch this VM's metadata service and forward every maintenance change",
        "Watch Azure Scheduled Events or GCE maintenance metadata, publish every change as a CloudEvent, "
        "and carry approvals back. Every flag has an MBRIDGE_* environment variable.",
    ),
    "approve": Command(
        "mbridge.approve_cli",
        "ask a VM's agent to approve an Azure scheduled event, and wait for its answer",
        "Send an approve command to one VM through the bus. The agent re-checks the event against IMDS "
        "before POSTing. Exit 0 accepted, 1 rejected (reason printed), 2 no answer or a configuration error "
        "(one line naming the setting; nothing was sent).",
    ),
    "commands-entity": Command(
        "mbridge.commands_entity_cli",
        "print the commands queue or topic of a VM when commands are spread over several",
        "Print the commands entity (queue or topic) that carries a VM's commands in a deployment of N "
        "commands shards: the same SHA-256 of the lower-cased name the functions, `mbridge approve` and "
        "the Terraform use. For the Bicep's per-VM commands subscription and for agents of the queue mode.",
    ),
    "demo": Command(
        "mbridge.demo.cli",
        # No count of the flows here: `--help` imports no demo module; `mbridge demo --help` says it.
        "run the whole product locally on its maintenance flows and check every expectation",
        "Simulators for an Azure availability set, a Spot VM, a scale-set instance and a GCE VM; an agent "
        "per VM; the bus and the functions; a live timeline per event, a summary, and exit 0 only when "
        "every expectation held.",
    ),
    "replay": Command(
        "mbridge.replay_cli",
        "run what the functions took through their rules again, and print what they did and why",
        "Recorded inputs (the demo's recorded.jsonl) or envelopes (the agent's jsonl output) through the "
        "functions' own path, proofs checked with their trust settings, on a virtual clock taken from the "
        "inputs: one JSON line per action or refusal (time, kind, event_id, status, vm, action, at, reason); "
        "duplicates take no new action. Nothing is drained nor sent.",
    ),
    "audit": Command(
        "mbridge.audit_cli",
        "read the audit log by VM or by event: a table on a terminal, JSON lines otherwise",
        "Read the audit log the functions write (the local SQLite, Table Storage or Firestore). See "
        "docs/operations.md#the-audit-log.",
    ),
    "fleet": Command(
        "mbridge.fleet_cli",
        "show upcoming and running maintenance across the fleet, from the audit log",
        "One row per (VM, event) from the audit log (the local SQLite, Table Storage or Firestore, the flags "
        "of `mbridge audit list`): kind, NotBefore, who reported it (agent, centre, both), drained, approved, "
        "how it ended, whether the VM's agent was found silent. Events not ended, by NotBefore; --all for "
        "every one, --json for JSON lines. See docs/operations.md#the-fleet-view.",
    ),
    "recover": Command(
        "mbridge.recover_cli",
        "list the VMs still drained, and put one back whose event's end no report will finish (audited)",
        "For an operator, with the function app's settings and their own credentials: `list` prints every VM "
        "this system drained and has not put back; `restore` puts one back for one event through the "
        "completion's own path (restore, drop the drain record, free the budget slot, admit waiting events), "
        "refused when the event's end was never seen unless --force. Every restore is audited with --by and "
        "--reason. See docs/operations.md#recovering-a-vm-left-drained.",
    ),
}


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `chosen`'s module is imported to add its flags."""
    parser = argparse.ArgumentParser(
        prog="mbridge",
        description="Forward cloud VM maintenance notices to a bus, and rehearse them locally.",
    )
    # wire.version reads only the installed distribution's metadata: `--version` stays as light as `--help`.
    parser.add_argument("--version", action="version", version=f"mbridge {version()}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    subcommands.required = True
    for name, command in COMMANDS.items():
        sub = subcommands.add_parser(name, help=command.help, description=command.description)
        if name == chosen:
            module = importlib.import_module(command.module)
            module.configure(sub)
            sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in arguments if not a.startswith("-")), None)
    if chosen == "agent":
        from agent.lean import leave_out_unused_modules

        leave_out_unused_modules()  # before the agent's modules import requests
    args = build_parser(chosen).parse_args(arguments)
    exit_code: int = args.run(args)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
