"""Whether the load balancer should send traffic to this VM (`/readyz`), and why not.

`/readyz` is how a health-probe load balancer drains the VM with no control-plane permission at
all: it turns unready on a `drain` command and ready again on `restore`
(docs/contracts.md#what-the-agent-checks). Without a command channel it is unready while an
impactful event for this VM is pending, so the load balancer drains the VM on its own.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

LOGGER = logging.getLogger("mbridge.health")


BLIND = (
    "the metadata service has not answered yet: maintenance of this VM cannot be seen "
    "(see mbridge_errors_total and the agent's log; mbridge agent --check)"
)


class Readiness:
    """Whether the load balancer should send traffic to this VM, and why not.

    With a command channel, `drain`/`restore` commands decide. Without one, a pending
    impactful event for this VM decides. `persist` saves the drained flag, so a restart
    in the middle of maintenance does not readmit the VM.

    An agent made `awaiting_first_poll` is not ready until its metadata service answered once: a
    VM whose agent cannot see its maintenance does not take traffic when it starts. (A later
    outage leaves readiness alone: the alerts on the last good poll say so, and taking every VM
    out when a metadata service hiccups would be worse than the maintenance.)
    """

    def __init__(
        self,
        *,
        follows_commands: bool,
        drained: bool = False,
        reason: str = "",
        persist: Callable[[bool, str], None] = lambda drained, reason: None,
        awaiting_first_poll: bool = False,
    ) -> None:
        self._blind = awaiting_first_poll
        self._follows_commands = follows_commands
        self._drained = drained
        self._drain_reason = reason
        self._pending_impact: str | None = None
        self._persist = persist
        self._lock = threading.Lock()

    def set_drained(self, drained: bool, reason: str) -> None:
        with self._lock:
            self._drained = drained
            self._drain_reason = reason
        self._persist(drained, reason)
        LOGGER.info("readiness: %s (%s)", "drained" if drained else "restored", reason)

    @property
    def drained(self) -> bool:
        """Whether a `drain` command took this VM out and no `restore` has put it back."""
        with self._lock:
            return self._follows_commands and self._drained

    def metadata_answered(self) -> None:
        """The metadata service answered: from now on, maintenance of this VM can be seen."""
        if self._blind:
            with self._lock:
                self._blind = False

    def set_pending_impact(self, reason: str | None) -> None:
        with self._lock:
            self._pending_impact = reason

    def status(self) -> tuple[bool, str]:
        with self._lock:
            if self._blind:
                return False, BLIND
            if self._follows_commands:
                return (not self._drained, self._drain_reason or ("drained" if self._drained else "ready"))
            if self._pending_impact:
                return False, self._pending_impact
            return True, "no impactful event pending for this VM"
