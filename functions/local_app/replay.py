"""`mbridge replay`: run recorded envelopes through the function core on a virtual clock
(docs/contracts.md#replay-output).

Each envelope is processed at its own `time`, against an in-memory store and a load balancer
that drains any VM, so the output shows exactly what the policy would have done — to test a
policy before deploying it, or to review an incident from the agent's recorded output.
Duplicated envelopes (same id) produce no new actions, as in production; nor does a step recorded
after its event's end (an unordered bus): it is printed as `none`, with a reason starting "late:".
Each report is taken as coming from the VM it names (`ReporterName`): replay rehearses the policy,
and the recorded proofs of identity have long expired; the trust rule — a report moves only its
own VM — applies as in production.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from functions.core.policy import PolicyError, load_policy
from functions.core.ports import JsonObject
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from wire.commands import Command
from wire.envelope import decode
from wire.errors import MalformedEnvelopeError
from wire.identity import ReporterName
from wire.timefmt import format_rfc3339


class _EveryVmBalancer:
    """Replay has no real pools: every VM counts as drainable, so restores show up too."""

    def locate(self, vm: str) -> JsonObject | None:
        return {"replay": True}

    def remove(self, vm: str, memento: JsonObject) -> None:
        return None

    def restore(self, vm: str, memento: JsonObject) -> None:
        return None


class _Discard:
    def send(self, command: Command) -> None:
        return None


# Exit status when not one line was an envelope: the wrong file (a log, an empty file) must not
# pass for a replay in which the policy did nothing.
NOTHING_REPLAYED = 2


def replay(
    lines: Iterable[str], policy_text: str | None, out: TextIO, err: TextIO, policy_source: str | None = None
) -> int:
    """Replay `lines`; 0, or NOTHING_REPLAYED when none of them was an envelope."""
    policy = load_policy(policy_text, policy_source)
    store = SqliteStore(":memory:")
    deps = Deps(
        store=store, balancer=_EveryVmBalancer(), sender=_Discard(), audit=store, policy=policy, verifier=ReporterName()
    )
    envelopes = 0
    for number, line in _numbered(lines):
        body = line.encode("utf-8")
        try:
            when = decode(body).time
        except MalformedEnvelopeError as exc:
            print(f"line {number}: skipped, not an envelope: {exc}", file=err)
            continue
        envelopes += 1
        outcome = process(body, deps, when)
        for taken in outcome.actions:
            out.write(json.dumps(_line(when, taken)) + "\n")
    store.close()
    return 0 if envelopes else NOTHING_REPLAYED


def _line(when: Any, taken: Any) -> dict[str, Any]:
    return {
        "time": format_rfc3339(when),
        "event_id": taken.event.event_id,
        "status": taken.event.status.value,
        "vm": taken.vm,
        "action": taken.action,
        "at": format_rfc3339(taken.at) if taken.at else None,
        "reason": taken.reason,
    }


def _numbered(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield number, line.strip()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--events", required=True, help="JSON lines of envelopes (the agent's jsonl output), - for stdin"
    )
    parser.add_argument("--policy", help="policy file (JSON or YAML); default: the default policy of docs/policy.md")


def run(args: argparse.Namespace) -> int:
    try:
        policy_text = Path(args.policy).read_text(encoding="utf-8") if args.policy else None
    except (OSError, UnicodeDecodeError) as exc:
        print(f"mbridge replay: cannot read the policy file {args.policy}: {_reason(exc)}", file=sys.stderr)
        return 2
    source = "standard input" if args.events == "-" else args.events
    try:
        if args.events == "-":
            status = replay(sys.stdin, policy_text, sys.stdout, sys.stderr, args.policy)
        else:
            with open(args.events, encoding="utf-8") as events:
                status = replay(events, policy_text, sys.stdout, sys.stderr, args.policy)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"mbridge replay: cannot read the events file {source}: {_reason(exc)}", file=sys.stderr)
        return 2
    except PolicyError as exc:
        print(f"mbridge replay: {exc}", file=sys.stderr)
        return 2
    if status == NOTHING_REPLAYED:
        print(
            f"mbridge replay: no line of {source} is an envelope; give the agent's jsonl output (--transport jsonl)",
            file=sys.stderr,
        )
    return status


def _reason(exc: Exception) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
