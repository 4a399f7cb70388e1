"""`mbridge replay`: run what the functions took through the functions' own path again, on a virtual
clock, and print what they did and why (docs/contracts.md#replay-output).

Each input goes where the functions sent it — a message to `process`, a control-plane report to
`process_central`, a sweep to `sweep_silent` — with the policy and the trust settings the functions
use, against a store in memory and ports that only keep what they were asked (`DryBalancer`,
`DrySender`): nothing leaves the process. What replay prints is read from its own audit log, so a
refusal (`unverified`, `not-self`) is printed as the functions audited it.

The clock of an input is the time it carries (`functions.local_app.recording`): a recorded input's
`received_at`, when the functions took it, which is also the moment its proof is judged at, as the
functions judged it (a proof has a life: judged now, every recorded proof would have expired). A bare
envelope (the agent's jsonl output) has no such time: its own `time` stands in, which its sender
wrote.

Who a report comes from is decided as the functions decide it (`Trust`): its proof checked with the
functions' trust settings, or, only when asked for, each reporter taken at its word.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from functions.core.central import process_central, sweep_silent
from functions.core.policy import TRUST_REPORTER_NAME, Policy
from functions.core.ports import AuditKind, AuditLog, AuditRecord, Finishing, JsonObject
from functions.core.process import Deps, process
from functions.local_app.recording import CentralReceived, NotRecordedError, Received, RecordedInput, Sweep, recorded
from functions.local_app.store import SqliteStore
from functions.trust.trust_file import load_trust_file
from wire.bounds import bounded
from wire.commands import Command
from wire.envelope import decode
from wire.errors import MalformedEnvelopeError, PermanentError, RetryableError
from wire.identity import IdentityVerifier, ReporterName
from wire.jsontext import load_json
from wire.timefmt import format_rfc3339

# Exit status when not one line was an input: the wrong file (a log, an empty file) must not pass
# for a replay in which the policy did nothing.
NOTHING_REPLAYED = 2
# Exit status when an input could not be processed (a proof that could not be checked now): the
# output lacks what the functions did for it.
INCOMPLETE = 1

# What replay prints of its audit log: the actions, and why a report moved nothing.
PRINTED = frozenset(
    {AuditKind.ACTION, AuditKind.UNVERIFIED, AuditKind.NOT_SELF, AuditKind.MALFORMED, AuditKind.AGENT_SILENT}
)


@dataclass(frozen=True)
class Trust:
    """Who replay takes a report to come from, and how it says so.

    `verifier` is what the functions' `Deps.verifier` would be: the trust settings' verifier, a
    `ReporterName` when told to take each reporter at its word, or None when the policy's own trust
    is `reporter-name` (the functions then take the reporter's word themselves)."""

    verifier: IdentityVerifier | None
    description: str

    @property
    def checks_proofs(self) -> bool:
        return self.verifier is not None and not isinstance(self.verifier, ReporterName)


def trust_file(path: str | Path) -> Trust:
    """The trust file the local functions verify with (MBRIDGE_TRUST_FILE).

    Raises:
        TrustFileError: it cannot be read or used.
    """
    return Trust(load_trust_file(path), f"proofs checked with the trust file {path}")


def reporter_names() -> Trust:
    return Trust(
        ReporterName(),
        "each report taken at its reporter's word (--trust-reporter-name): no proof is checked, so a forged "
        "report counts as genuine",
    )


def policys_own(policy: Policy) -> Trust | None:
    """The trust the policy itself decides (`trust: reporter-name`: the functions check no proof), or
    None when it leaves it to the trust settings."""
    if policy.trust != TRUST_REPORTER_NAME:
        return None
    return Trust(
        None, "the policy's trust is reporter-name: each report taken at its reporter's word, as the functions take it"
    )


class DryBalancer:
    """A load balancer that only keeps what it was asked: every VM is found in a pool (so that its
    drain and its restore are shown), none is moved."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []  # ("remove" | "restore", VM)

    def locate(self, vm: str) -> JsonObject | None:
        return {"replay": True}

    def remove(self, vm: str, memento: JsonObject) -> None:
        self.asked.append(("remove", vm))

    def restore(self, vm: str, memento: JsonObject) -> None:
        self.asked.append(("restore", vm))


class DrySender:
    """A command sender that only keeps the commands it was given: none reaches an agent."""

    def __init__(self) -> None:
        self.sent: list[Command] = []

    def send(self, command: Command) -> None:
        self.sent.append(command)


@dataclass
class _Printing:
    """The replay's audit log, keeping the records written since they were last printed."""

    log: AuditLog
    new: list[AuditRecord] = field(default_factory=list)

    def append(self, record: AuditRecord) -> None:
        self.log.append(record)
        self.new.append(record)

    def append_all(self, records: Sequence[AuditRecord], then: Finishing | None = None) -> None:
        self.log.append_all(records, then)
        self.new.extend(records)

    def query(self, *, vm: str | None = None, event_id: str | None = None) -> Sequence[AuditRecord]:
        return self.log.query(vm=vm, event_id=event_id)

    def taken(self) -> list[AuditRecord]:
        records, self.new = self.new, []
        return records


def replay(
    lines: Iterable[str],
    policy: Policy,
    trust: Trust,
    out: TextIO,
    err: TextIO,
    *,
    balancer: DryBalancer | None = None,
    sender: DrySender | None = None,
) -> int:
    """Replay `lines`; 0, INCOMPLETE when an input could not be processed, or NOTHING_REPLAYED when
    none of them was an input."""
    print(f"mbridge replay: trust: {trust.description}", file=err)
    store = SqliteStore(":memory:")
    audit = _Printing(store)
    deps = Deps(
        store=store,
        balancer=balancer or DryBalancer(),
        sender=sender or DrySender(),
        audit=audit,
        policy=policy,
        verifier=trust.verifier,
        # An action is stamped with its input's time: no real time passes on the virtual clock.
        monotonic=lambda: 0.0,
    )
    inputs = 0
    incomplete = False
    said_sender_time = False
    try:
        for number, line in _numbered(lines):
            taken = _input(number, line, err)
            if taken is None:
                continue
            item, bare = taken
            inputs += 1
            if bare and trust.checks_proofs and not said_sender_time:
                said_sender_time = True
                print(
                    f"line {number}: an envelope without received_at: its proof is judged as of its own time, "
                    "which its sender wrote (a recording of the functions' input carries when they received it)",
                    file=err,
                )
            try:
                _run(item, deps)
            except RetryableError as exc:
                incomplete = True
                print(f"line {number}: not processed, it could not be checked now: {bounded(str(exc))}", file=err)
            except PermanentError as exc:
                # What the local host does with it: set it aside, and go on with the next one.
                print(f"line {number}: set aside, as the functions set it aside: {bounded(str(exc))}", file=err)
            for record in audit.taken():
                if record.kind in PRINTED:
                    out.write(json.dumps(_line(record)) + "\n")
    finally:
        store.close()
    if not inputs:
        return NOTHING_REPLAYED
    return INCOMPLETE if incomplete else 0


def _input(number: int, line: str, err: TextIO) -> tuple[RecordedInput, bool] | None:
    """The input a line holds, and whether it is a bare envelope; None (said on `err`) when it is none."""
    try:
        document = load_json(line)
        item = recorded(document)
    except (ValueError, NotRecordedError) as exc:
        print(f"line {number}: skipped, not an envelope nor a recorded input: {exc}", file=err)
        return None
    if item is not None:
        return item, False
    body = line.encode("utf-8")
    try:
        when = decode(body).time
    except MalformedEnvelopeError as exc:
        print(f"line {number}: skipped, not an envelope: {exc}", file=err)
        return None
    return Received(when, body), True


def _run(item: RecordedInput, deps: Deps) -> None:
    if isinstance(item, Received):
        process(item.body, deps, item.at)
    elif isinstance(item, CentralReceived):
        process_central(item.report, deps, item.at)
    elif isinstance(item, Sweep):
        sweep_silent(deps, item.at)


def _line(record: AuditRecord) -> dict[str, Any]:
    return {
        "time": format_rfc3339(record.time),
        "kind": record.kind,
        "event_id": record.event_id,
        "status": record.status,
        "vm": record.vm,
        "action": record.action,
        "at": format_rfc3339(record.at) if record.at else None,
        "reason": record.reason,
    }


def _numbered(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield number, line.strip()
