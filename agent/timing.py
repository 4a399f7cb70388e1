"""Time for the agent, injectable: a wall clock, a monotonic clock, and jittered backoff."""

from __future__ import annotations

import random
import threading
import time
from datetime import datetime, timezone
from typing import Callable, Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current wall-clock time, aware, UTC."""
        ...

    def monotonic(self) -> float: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()


class Backoff:
    """Decorrelated jitter ("Exponential Backoff And Jitter", AWS architecture blog):
    each delay is random between `initial` and three times the previous one, capped.
    Many agents behind one throttled endpoint then spread out instead of retrying in step.
    """

    def __init__(
        self,
        initial: float = 0.5,
        maximum: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError("backoff needs 0 < initial <= maximum")
        self.initial = initial
        self.maximum = maximum
        self._rng = rng or random.Random()
        self._previous = initial

    def next_delay(self) -> float:
        delay = min(self.maximum, self._rng.uniform(self.initial, self._previous * 3))
        self._previous = delay
        return delay

    def reset(self) -> None:
        self._previous = self.initial


class RateLimiter:
    """Spaces calls at least `1 / per_second` apart, across threads.

    Azure IMDS allows 5 requests per second per VM, shared with every other IMDS user on
    that VM; the agent keeps below it with a margin.
    """

    def __init__(
        self,
        per_second: float,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if per_second <= 0:
            raise ValueError("per_second must be positive")
        self._interval = 1.0 / per_second
        self._monotonic = monotonic
        self._sleep = sleep
        self._next_slot = 0.0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            now = self._monotonic()
            slot = max(now, self._next_slot)
            self._next_slot = slot + self._interval
        if slot > now:
            self._sleep(slot - now)
