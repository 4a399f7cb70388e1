"""Telling the agent to stop: from a signal handler, from another thread, or from a test.

The agent's threads block until there is work (a poll due, an observation, a row to publish, a
command) rather than waking on short timers to look at a flag; a stop must therefore wake them.
Its main thread does nothing but wait for the stop, so the stop must be something a signal
handler can set while that thread waits on it.

`threading.Event` cannot be: the handler runs on the main thread between two bytecodes, and
`Event.set` takes the lock that `Event.wait` may hold on that same thread at that moment, which
deadlocks. `StopSignal.set` takes no lock: it raises a flag and writes a byte to a socket pair;
`wait` is a `select()` on the other end, which that byte leaves readable for good, so every
waiter, present and future, returns at once.
"""

from __future__ import annotations

import contextlib
import select
import socket
from typing import Protocol


class StopFlag(Protocol):
    """What the agent needs of a stop: `threading.Event` and `StopSignal` both are one."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class StopSignal:
    """A one-way stop that any thread, or a signal handler, may set."""

    def __init__(self) -> None:
        self._set = False
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)

    def set(self) -> None:
        self._set = True
        # OSError: a byte is already waiting (the buffer is full) or the signal was closed: woken either way
        with contextlib.suppress(OSError):
            self._writer.send(b"\0")

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set or until `timeout` seconds passed; True when set."""
        if not self._set:
            try:
                select.select([self._reader], [], [], timeout)
            except (OSError, ValueError):
                return self._set  # closed under us: the process is ending
        return self._set

    def close(self) -> None:
        self._reader.close()
        self._writer.close()
