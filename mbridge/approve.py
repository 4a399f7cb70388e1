"""`mbridge approve`: ask one VM's agent to approve an Azure scheduled event, and wait for its answer.

See docs/contracts.md#results. The command goes on the commands channel, addressed to the target VM; the agent
re-checks everything against a fresh Scheduled Events document and answers with a result envelope
on the events channel. Exit codes: 0 accepted, 1 rejected (the reason is printed), 2 no answer
(nothing came within `--wait`, the command could not be sent, or no results reader is configured).
2 is also a configuration error found before anything is sent (mbridge.approve_cli): the same code
as a usage error of the command line, told apart by its one line `mbridge approve: <setting> (...)`.
`--no-wait` (wait=None) prints the command_id and returns 0 once the bus accepted the command.

A command carries a trace only when the operator gives one (`trace`, `--trace`): a new span of that
trace, inside the signed body as the functions send it. This command has no audit log to look the
event's trace up in, and cannot know whether the target's agent reads trace fields (an agent older
than traces refuses a command with a field it does not know; the functions send one only to an
agent whose report carried a trace context): so without `--trace` it sends none.

A result counts only when its proof of identity is the target VM's (`verifier`): any VM may publish
on the events channel, and a forged "accepted" would tell the operator an approval happened that
did not. Results without such a proof are printed as ignored, and the wait goes on. Without a
verifier (`--insecure-unverified-results`) every result is taken, and the answer says so.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TextIO

from agent.timing import Clock
from wire.commands import Command, CommandType, encode_command, new_command
from wire.envelope import decode
from wire.errors import BridgeError, MalformedEnvelopeError
from wire.identity import IdentityVerifier, UnverifiedError
from wire.model import Cloud, CommandResult
from wire.timefmt import format_rfc3339
from wire.tracecontext import new_trace
from wire.transports.base import CommandSender, OutboundMessage, ResultReader

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

LOGGER = logging.getLogger("mbridge.commands")

EXIT_ACCEPTED = 0
EXIT_REJECTED = 1
EXIT_NO_ANSWER = 2
# A setting approve cannot use (no bus, a bad value): nothing was sent. The code of argparse's own
# usage errors and of the agent's configuration errors, so that 2 before sending means "fix the call".
EXIT_CONFIG = 2
# One read waits at most this long, so the overall deadline is kept even with a slow bus.
READ_SLICE_SECONDS = 5.0


def run_approve(
    *,
    event_id: str,
    target: str,
    cloud: Cloud,
    sender: CommandSender,
    reader: ResultReader | None,
    wait: float | None,
    signing_key: Ed25519PrivateKey | None,
    verifier: IdentityVerifier | None,
    clock: Clock,
    out: TextIO,
    trace: str | None = None,
) -> int:
    """Send one approve command and report its outcome; returns the exit code. `verifier` None
    takes results without checking who sent them (unsafe); `trace` (a trace id) the trace the
    command is a span of (None: it carries none)."""
    if cloud is Cloud.GCE:
        print(
            "GCE has no in-VM approval: its 'start now' is instances.performMaintenance "
            f"(gcloud compute instances perform-maintenance {target}); nothing was sent",
            file=out,
        )
        return EXIT_REJECTED
    command = new_command(
        CommandType.APPROVE,
        target=target,
        event_id=event_id,
        issued_at=clock.now(),
        trace=new_trace(trace) if trace is not None else None,
    )
    if signing_key is not None:
        from wire.signing import sign_command

        command = sign_command(command, signing_key)
    try:
        sender.send_command(_message(command))
    except (BridgeError, OSError) as exc:
        print(f"could not send the approve command for event {event_id} to {target}: {exc}", file=out)
        return EXIT_NO_ANSWER
    if wait is None:
        print(command.command_id, file=out)
        return EXIT_ACCEPTED
    print(
        f"sent approve command {command.command_id} for event {event_id} to {target} "
        f"({'signed' if command.signature else 'unsigned'}, expires {format_rfc3339(command.expires_at)}"
        f"{f', trace {trace}' if trace is not None else ''})",
        file=out,
    )
    if reader is None:
        print(_no_reader_hint(), file=out)
        return EXIT_NO_ANSWER
    return _await_result(command, reader, wait, verifier, clock, out)


def _message(command: Command) -> OutboundMessage:
    return OutboundMessage(
        envelope_id=command.command_id,
        body=encode_command(command),
        key=command.target,
        attributes={"type": command.type.value, "target": command.target, "event_id": command.event_id},
    )


def _await_result(
    command: Command, reader: ResultReader, wait: float, verifier: IdentityVerifier | None, clock: Clock, out: TextIO
) -> int:
    deadline = clock.monotonic() + wait
    while True:
        remaining = deadline - clock.monotonic()
        if remaining <= 0:
            break
        try:
            bodies = reader.read_results(min(remaining, READ_SLICE_SECONDS))
        except (BridgeError, OSError) as exc:
            print(f"cannot read results of command {command.command_id}: {exc}", file=out)
            return EXIT_NO_ANSWER
        for body in bodies:
            result = _result_for(command, body, verifier, clock, out)
            if result is not None:
                return _report(result, out, proven=verifier is not None)
    print(
        f"no answer for command {command.command_id} within {wait:g} s: the agent on {command.target} may be "
        "down, not subscribed to its commands, or behind; the command stays valid until "
        f"{format_rfc3339(command.expires_at)}",
        file=out,
    )
    return EXIT_NO_ANSWER


def _result_for(
    command: Command, body: bytes, verifier: IdentityVerifier | None, clock: Clock, out: TextIO
) -> CommandResult | None:
    """The result of this command in one envelope body, or None (other envelopes share the channel,
    and a result the target's proof does not vouch for is ignored)."""
    try:
        envelope = decode(body)
    except MalformedEnvelopeError as exc:
        LOGGER.debug("skipping an envelope that does not decode: %s", exc)
        return None
    data = envelope.data
    if not isinstance(data, CommandResult) or data.command_id != command.command_id:
        return None
    if data.target != command.target:
        # Only the target answers for a command; anything else is misrouted or forged.
        LOGGER.warning(
            "ignoring a result for %s from %s, not from the target %s", data.command_id, data.target, command.target
        )
        return None
    if verifier is not None:
        now = clock.now()
        try:
            sender = verifier.verify(envelope, now, now).vm
        except UnverifiedError as exc:
            print(f"ignored a '{data.result}' result without a valid proof of {command.target}: {exc}", file=out)
            return None
        if sender != command.target:
            print(f"ignored a '{data.result}' result for {command.target} proven by {sender}", file=out)
            return None
    return data


def _report(result: CommandResult, out: TextIO, *, proven: bool) -> int:
    vouched = "" if proven else " (not verified: --insecure-unverified-results)"
    print(f"{result.result} by {result.target}{vouched}: {result.reason}", file=out)
    return EXIT_ACCEPTED if result.accepted else EXIT_REJECTED


def _no_reader_hint() -> str:
    return (
        "cannot wait for the result: no results subscription is configured. Results travel on the events "
        "channel (the 'maintenance-events' topic, type org.maintenancebridge.command.*): give mbridge approve a "
        "subscription of that topic (Service Bus topic subscription or Pub/Sub subscription), or pass --no-wait"
    )
