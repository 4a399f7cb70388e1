"""When the agent holds its command path open, and when it lets it go.

Commands only ever concern an event of this VM: a `drain` and an `approve` answer its report of the
event, a `restore` answers the report of its end, an operator approves an event the VM has open. So
an agent with nothing open has nothing to wait for, and holding a connection and a receive for it
all the same is what stops a fleet at the buses' quotas (5,000 connections per Service Bus
namespace, 5,000 concurrent receives per entity: docs/scale.md). The agent is *engaged* while

- an event of this VM is open (scheduled or started) in its metadata document,
- its `/readyz` is drained (a `restore` is owed; also after `mbridge recover restore`),
- a held command waits for its time, or a result waits to be recorded,

and for `linger_seconds` after the last moment any of these held: the `restore` that answers an
event's end comes within seconds of it, a command still queued for the VM is read before it
expires (commands live 10 minutes), and an agent that (re)starts is engaged for that long too, so a
command sent while it was down is not left to expire. Outside that the command loop releases the
transport's connections and receives nothing; a command that arrives meanwhile waits in its queue
or subscription until the VM has an event again, or expires there.
"""

from __future__ import annotations

from typing import Callable

# Commands live 10 minutes (docs/commands.md): lingering that long reads every command sent for an
# event that just ended, or sent while the agent was starting.
DEFAULT_LINGER_SECONDS = 600.0


class Engagement:
    """Whether the command path should be open now. Not thread-safe: the command loop owns it."""

    def __init__(self, monotonic: Callable[[], float], linger_seconds: float = DEFAULT_LINGER_SECONDS) -> None:
        if linger_seconds < 0:
            raise ValueError("the command linger must be 0 seconds or more")
        self._monotonic = monotonic
        self._linger = linger_seconds
        self._last_busy = monotonic()  # starting counts: a command may have been sent while the agent was down

    def engaged(self, *, open_events: bool, drained: bool, work_pending: bool) -> bool:
        """Given what holds the path open now, whether to receive; each call that finds something
        holding it restarts the linger."""
        now = self._monotonic()
        if open_events or drained or work_pending:
            self._last_busy = now
            return True
        return now - self._last_busy < self._linger

    def seconds_left(self) -> float:
        """How long the path stays open with nothing holding it (0 once the linger is over)."""
        return max(0.0, self._linger - (self._monotonic() - self._last_busy))
