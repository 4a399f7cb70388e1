"""The command processor: checks each command addressed to this VM, holds it until its execute_at,
and has it executed at most once (docs/contracts.md#what-the-agent-checks).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Callable

from agent import logs
from agent.commands.execution import CommandExecutor
from agent.commands.ledger import CommandLedger, EntryState, LedgerEntry
from agent.commands.ports import Approver, CommandRetryableError, Readiness
from agent.commands.results import expired_reason, rejected, trace_id_of
from agent.timing import Clock
from wire.commands import Command, MalformedCommandError, ReceivedCommand, decode_command, load_command_object
from wire.model import Cloud, CommandResult
from wire.timefmt import format_rfc3339

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from agent.traces import Spans

LOGGER = logging.getLogger("mbridge.commands")

# A held command whose execution met an unavailable IMDS is tried again this much later (its
# bus message is already settled, so no redelivery will bring it back).
RETRY_DELAY = timedelta(seconds=5)
PRUNE_INTERVAL = timedelta(hours=1)

IGNORED_OTHER_TARGET = "other_target"
UNKNOWN_EVENT = "unknown"


class CommandProcessor:
    """Checks, holds and executes the commands addressed to `vm_name`.

    `handle` is called for each received message; `run_due` whenever `next_due_at` has come.
    Both return the results to publish. One instance per agent; calls are serialised.
    """

    def __init__(
        self,
        *,
        vm_name: str,
        cloud: Cloud,
        ledger: CommandLedger,
        readiness: Readiness,
        approver: Approver | None,
        verify_key: Ed25519PublicKey | Callable[[], Ed25519PublicKey] | None,
        dry_run: bool,
        clock: Clock,
        on_ignored: Callable[[str], None] = lambda reason: None,
        spans: Spans | None = None,
    ) -> None:
        self._vm_name = vm_name
        self._ledger = ledger
        # The key, or how to load it when the first command comes (the agent then loads cryptography
        # only once it has a command to check: agent/main.py checked at start that the key loads).
        self._verify_key = verify_key
        self._dry_run = dry_run
        self._clock = clock
        self._executor = CommandExecutor(
            vm_name=vm_name, cloud=cloud, readiness=readiness, approver=approver, dry_run=dry_run, clock=clock
        )
        self._on_ignored = on_ignored
        self._spans = spans  # None: no span is exported (the default)
        self._lock = threading.RLock()
        self._last_prune = clock.now()
        interrupted = ledger.requeue_interrupted()
        if interrupted:
            LOGGER.warning(
                "%d command(s) were interrupted while executing; they will be re-validated against a fresh "
                "document and executed at most once more",
                interrupted,
            )

    # ---- receipt

    def handle(self, body: bytes) -> CommandResult | None:
        """Check one received command and execute it when due.

        Returns the result to publish now, or None when the command is held for its execute_at
        (or already held) or is addressed to another VM.

        Raises:
            CommandRetryableError: IMDS was unavailable; no final result was recorded. Leave the
                message unsettled so the bus redelivers it.
        """
        with self._lock:
            try:
                received = decode_command(body)
            except MalformedCommandError as exc:
                return self._malformed(body, exc)
            command = received.command
            if command.target != self._vm_name:
                self._ignore(command.command_id, command.target)
                return None
            LOGGER.info(
                "received %s command %s for event %s",
                command.type.value,
                command.command_id,
                command.event_id,
                extra=_fields(command),
            )
            if received.trace_problem is not None:
                # Ignored, never refused for it: a trace decides nothing about a command.
                LOGGER.warning(
                    "command %s carries a trace context that is not one, ignored: %s",
                    command.command_id,
                    received.trace_problem,
                    extra=_fields(command),
                )
            refusal = self._signature_refusal(received)
            if refusal is not None:
                LOGGER.warning("refused command %s: %s", command.command_id, refusal, extra=_fields(command))
                return rejected(command, refusal)
            return self._admit(received)

    def _malformed(self, body: bytes, exc: MalformedCommandError) -> CommandResult | None:
        other = _declared_target(body)
        if other is not None and other != self._vm_name:
            self._ignore("(malformed)", other)
            return None
        command_id = "malformed-" + hashlib.sha256(body).hexdigest()[:16]
        LOGGER.warning(
            "rejected malformed command %s: %s",
            command_id,
            exc,
            extra=logs.fields(command_id=command_id, vm=self._vm_name),
        )
        return CommandResult(
            command_id=command_id,
            accepted=False,
            event_id=UNKNOWN_EVENT,
            target=self._vm_name,
            reason=f"malformed command: {exc}",
        )

    def _ignore(self, command_id: str, target: str) -> None:
        LOGGER.info(
            "ignored command %s: it is addressed to %s, not to this VM (%s)",
            command_id,
            target,
            self._vm_name,
            extra=logs.fields(command_id=command_id, vm=self._vm_name),
        )
        self._on_ignored(IGNORED_OTHER_TARGET)

    def _signature_refusal(self, received: ReceivedCommand) -> str | None:
        if self._verify_key is None:
            return None
        if received.command.signature is None:
            return (
                "unsigned: this agent has a verification key and accepts signed commands only; "
                "sign the command with the matching private key"
            )
        from wire.signing import BadSignatureError, verify

        if callable(self._verify_key):
            self._verify_key = self._verify_key()
        try:
            verify(received.canonical, received.command.signature, self._verify_key)
        except BadSignatureError as exc:
            return f"bad signature: {exc}"
        return None

    def _admit(self, received: ReceivedCommand) -> CommandResult | None:
        command = received.command
        entry = self._ledger.get(command.command_id)
        if entry is not None:
            return self._replayed(received, entry)
        now = self._clock.now()
        if now >= command.expires_at:
            return self._finish(received, rejected(command, expired_reason(command, now)))
        if command.execute_at is not None and command.execute_at > now:
            self._ledger.hold(received, command.execute_at)
            LOGGER.info(
                "holding %s command %s for event %s until %s",
                command.type.value,
                command.command_id,
                command.event_id,
                format_rfc3339(command.execute_at),
                extra=_fields(command),
            )
            return None
        return self._execute(received)

    def _replayed(self, received: ReceivedCommand, entry: LedgerEntry) -> CommandResult | None:
        command = received.command
        if entry.digest != received.digest:
            # Not stored: the entry under this id belongs to the command that came first.
            LOGGER.warning(
                "rejected command %s: its id was used before by a different command",
                command.command_id,
                extra=_fields(command),
            )
            return rejected(command, "command_id reused with different content")
        if entry.result is not None:
            LOGGER.info(
                "command %s was seen before; answering with the stored result",
                command.command_id,
                extra=_fields(command),
            )
            return entry.result
        if entry.state is EntryState.HELD:
            return None
        # "executing" without a result: an earlier attempt failed transiently. Try again (re-validated).
        return self._execute(received)

    # ---- held commands

    def run_due(self) -> list[CommandResult]:
        """Execute the held commands whose execute_at has come; returns their results to publish.

        A transient IMDS failure puts the command back for `RETRY_DELAY` (never past its expiry,
        which then rejects it).
        """
        with self._lock:
            now = self._clock.now()
            self._maybe_prune(now)
            results = []
            for entry in self._ledger.due(now):
                received = decode_command(entry.body)
                try:
                    results.append(self._execute(received))
                except CommandRetryableError as exc:
                    retry_at = min(now + RETRY_DELAY, received.command.expires_at)
                    self._ledger.hold(received, retry_at)
                    LOGGER.warning(
                        "command %s will be tried again at %s: %s",
                        entry.command_id,
                        format_rfc3339(retry_at),
                        exc,
                        extra=_fields(received.command),
                    )
            return results

    def unreported(self) -> list[CommandResult]:
        """Results recorded in the ledger but not yet confirmed in the outbox (see CommandLedger)."""
        return self._ledger.unreported()

    def mark_reported(self, results: Sequence[CommandResult]) -> None:
        self._ledger.mark_reported([result.command_id for result in results])

    def next_due_at(self) -> datetime | None:
        return self._ledger.next_due_at()

    def approved_event_ids(self) -> frozenset[str]:
        """See CommandLedger.approved_event_ids; nothing in a dry run, which never POSTs."""
        return frozenset() if self._dry_run else self._ledger.approved_event_ids()

    def _maybe_prune(self, now: datetime) -> None:
        if now - self._last_prune >= PRUNE_INTERVAL:
            self._last_prune = now
            self._ledger.prune()

    # ---- execution

    def _execute(self, received: ReceivedCommand) -> CommandResult:
        command = received.command
        attempt = self._ledger.begin(received)
        if self._spans is None:
            result = self._executor.run(command, attempt)
        else:
            # A span of the command's trace, under the span that sent it; an approval's POST is its child.
            with self._spans.command(command) as done:
                result = self._executor.run(command, attempt)
                done(result)
        LOGGER.info(
            "%s command %s for event %s: %s (%s)",
            command.type.value,
            command.command_id,
            command.event_id,
            result.result,
            result.reason,
            extra=_fields(command, result=result.result),
        )
        return self._finish(received, result)

    def _finish(self, received: ReceivedCommand, result: CommandResult) -> CommandResult:
        self._ledger.finish(received, result)
        return result


def _fields(command: Command, **more: object) -> dict[str, object]:
    """The log fields of a command: the VM it is addressed to and the event it is about."""
    return logs.fields(
        command_id=command.command_id,
        command_type=command.type.value,
        event_id=command.event_id,
        vm=command.target,
        trace_id=trace_id_of(command),
        **more,
    )


def _declared_target(body: bytes) -> str | None:
    """The `target` a malformed command names, if it names one: a broken command for another VM is
    that VM's to reject."""
    try:
        document = load_command_object(body)
    except MalformedCommandError:
        return None
    target = document.get("target")
    return target if isinstance(target, str) and target else None
