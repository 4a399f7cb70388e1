"""The local function host: consumes the agent's embedded bus and runs the function core on it.

It is the functions' side of the demo and of the end-to-end tests: SQLite state and audit, a
local load-balancer pool (plus the agents' /readyz through drain/restore commands), commands
back onto the same bus. Delivery is at least once, like the cloud buses: the read position
moves only after an envelope was processed, and processing is idempotent.

A message that fails with a RetryableError stays where it is and is taken again at the next step.
One that fails with any other error (a PermanentError: a deployment to fix; or a bug) would fail
the same way every time and hold up every message behind it: it is set aside in the store's
`dead_letters` table, with its body and the error, logged once, and the host goes on with the
next one, as a cloud bus moves such a message to its dead-letter queue.

With a `Recorder`, every message is written down with the time it was taken, before it is
processed: what `mbridge replay` reads to tell what was done and why.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime

from functions.core.policy import Policy
from functions.core.ports import LoadBalancer
from functions.core.process import Deps, Outcome, process
from functions.local_app.commands import LocalCommandSender
from functions.local_app.recording import Recorder
from functions.local_app.store import DeadLetter, SqliteStore
from functions.notify import WebhookConfig, notifying_audit
from wire.bounds import bounded
from wire.commands import Command
from wire.errors import PermanentError, RetryableError
from wire.identity import IdentityVerifier
from wire.transports.local import BusEvent, LocalBus

LOGGER = logging.getLogger("mbridge.functions.local")

READER = "functions"


class LocalFunctionHost:
    def __init__(
        self,
        bus: LocalBus,
        store: SqliteStore,
        balancer: LoadBalancer,
        policy: Policy,
        clock: Callable[[], datetime],
        on_outcome: Callable[[Outcome], None] = lambda outcome: None,
        verifier: IdentityVerifier | None = None,
        signer: Callable[[Command], Command] | None = None,
        webhook: WebhookConfig | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self._bus = bus
        self._store = store
        self._clock = clock
        self._on_outcome = on_outcome
        self._recorder = recorder
        sender = LocalCommandSender(bus)
        # With a webhook, the records it names are also posted there (docs/operations.md, "Notifications").
        audit = notifying_audit(store, webhook)
        self.deps = Deps(
            store=store, balancer=balancer, sender=sender, audit=audit, policy=policy, verifier=verifier, signer=signer
        )

    def step(self, limit: int = 100) -> int:
        """Process what is waiting on the bus; return how many envelopes were taken."""
        position = self._bus.position(READER)
        taken = 0
        for message in self._bus.read_events(position, limit):
            now = self._clock()
            if self._recorder is not None:
                self._recorder.envelope(message.body, now)
            try:
                outcome: Outcome | None = process(message.body, self.deps, now)
            except RetryableError as exc:
                # Like a platform retry: the position stays, the envelope comes again next step.
                LOGGER.warning("envelope %s left for a retry: %s", message.envelope_id[:16], bounded(str(exc)))
                break
            except Exception as exc:  # no retry can mend it: set it aside, go on
                self._dead_letter(message, exc)
                outcome = None
            self._bus.save_position(READER, message.seq)
            if outcome is not None:
                self._on_outcome(outcome)
            taken += 1
        return taken

    def _dead_letter(self, message: BusEvent, error: Exception) -> None:
        reason = bounded(f"{type(error).__name__}: {error}")
        self._store.dead_letter(DeadLetter(message.envelope_id, message.seq, message.body, reason, self._clock()))
        LOGGER.error(
            "envelope %s (bus seq %d) set aside in the dead_letters table of the functions store: %s",
            message.envelope_id[:16],
            message.seq,
            reason,
            # A bug's traceback, once; a PermanentError says all there is to say.
            exc_info=None if isinstance(error, PermanentError) else error,
        )

    def run(self, stop: threading.Event, poll_seconds: float = 0.05) -> None:
        while not stop.is_set():
            if not self.step():
                stop.wait(poll_seconds)
