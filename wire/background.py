"""One worker thread behind a small queue that drops its oldest item when full.

What hands work to a `DropOldestWorker` must never wait for it: the agent's main loop tells of a
change (agent/hooks.py) and a function invocation of a notice (functions/notify/notifier.py), and a
hook or webhook that hangs must hold up neither. So `put` returns at once, always; when the queue is
full it makes room by dropping the item that waited longest (the newest say most about now), and
says so through `on_drop`, for the owner to count and log. Items are handled in order, one at a
time, on one daemon thread started with the first item; a process that exits does not wait for it.

Standard library only: the agent's Python 3.9 may import this module.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, Literal, TypeVar

T = TypeVar("T")

LOGGER = logging.getLogger("mbridge.wire.background")

# Why an item was dropped: the queue was full (the oldest one made room), or the worker was closed
# (given after `close`, or still waiting when `close` gave up on it).
DropReason = Literal["full", "closed"]


class DropOldestWorker(Generic[T]):
    """Hands each item `put` to `handle`, in order, on one thread of its own, with at most
    `capacity` items waiting; when full, the oldest waiting item is dropped (`on_drop`) to make room.

    `settle` waits, for a while, until nothing waits or runs; `close` settles, then drops what
    still waits and lets the thread end once its current item is done.
    """

    def __init__(
        self,
        handle: Callable[[T], None],
        *,
        capacity: int,
        on_drop: Callable[[T, DropReason], None],
        name: str,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"the capacity is the number of items that may wait: at least 1, not {capacity}")
        self.capacity = capacity
        self._handle = handle
        self._on_drop = on_drop
        self._name = name
        self._waiting: deque[T] = deque()
        # One condition for the queue, the busy flag and closing: the worker waits on it for items,
        # `settle` for the worker to be idle.
        self._lock = threading.Condition()
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def put(self, item: T) -> None:
        """Queue `item` for the worker; returns at once (having dropped the oldest, when full)."""
        dropped: list[tuple[T, DropReason]] = []
        with self._lock:
            if self._closed:
                dropped.append((item, "closed"))
            else:
                if len(self._waiting) >= self.capacity:
                    dropped.append((self._waiting.popleft(), "full"))
                self._waiting.append(item)
                self._start()
                self._lock.notify_all()
        self._report(dropped)

    def waiting(self) -> int:
        """How many items wait (not counting the one being handled)."""
        with self._lock:
            return len(self._waiting)

    def take_waiting(self, limit: int) -> list[T]:
        """Up to `limit` of the items waiting, oldest first, taken off the queue: the handler of one
        item calls this to handle those behind it together (a webhook digest)."""
        with self._lock:
            taken = [self._waiting.popleft() for _ in range(min(limit, len(self._waiting)))]
            if taken:
                self._lock.notify_all()
        return taken

    def settle(self, timeout: float) -> bool:
        """Wait until no item waits or is being handled; False when `timeout` ran out first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._waiting or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def close(self, timeout: float = 0.0) -> bool:
        """Take no more items; give those waiting up to `timeout` seconds, then drop what still
        waits. Returns whether everything was handled in time.

        An item being handled is not interrupted (it may hang): the thread ends after it.
        """
        settled = self.settle(timeout)
        with self._lock:
            self._closed = True
            dropped: list[tuple[T, DropReason]] = [(item, "closed") for item in self._waiting]
            self._waiting.clear()
            self._lock.notify_all()
        self._report(dropped)
        return settled

    def _start(self) -> None:
        # Started with the first item, not in __init__: an owner that is never given work (no hook
        # configured, a function that announces nothing) costs no thread.
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()

    def _report(self, dropped: list[tuple[T, DropReason]]) -> None:
        # Outside the lock: the owner's callback logs and takes its own lock for its counts, and
        # neither may keep `put` (the caller that must not wait) behind the worker.
        for item, reason in dropped:
            self._on_drop(item, reason)

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._closed:
                    self._lock.wait()
                if not self._waiting:
                    return  # closed, and nothing left
                item = self._waiting.popleft()
                self._busy = True
            try:
                self._handle(item)
            except Exception:  # the worker must outlive any one item; the owner handles what it expects
                LOGGER.exception("the %s worker failed on one item; it goes on with the next", self._name)
            finally:
                # Only now: `settle` returns once the handler is done (its outcome counted and logged).
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()
