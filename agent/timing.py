"""Time for the agent, injectable: a wall clock, a monotonic clock, and jittered backoff."""

from __future__ import annotations

import random
import threading
import time
from collections import deque
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
    """At most `per_second` calls in any window of `window` seconds (one by default), across
    threads (a sliding window).

    Azure IMDS allows 5 requests per second per VM, shared with every other IMDS user on
    that VM; the agent keeps below it with a margin. A window, not even spacing: the calls
    of an approval (re-read the document, then POST) right after a poll go out at once
    instead of a quarter-second apart each, and no second ever holds more than the limit.
    """

    def __init__(
        self,
        per_second: int,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        window: float = 1.0,
    ) -> None:
        if per_second < 1:
            raise ValueError("per_second must be a positive whole number")
        if window < 1.0:
            raise ValueError("window must be at least a second: it is a limit per second, with a margin")
        self._per_second = per_second
        self._window = window
        self._monotonic = monotonic
        self._sleep = sleep
        self._granted: deque[float] = deque()  # the moments of the last `per_second` calls
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            now = self._monotonic()
            slot = now
            if len(self._granted) == self._per_second:
                # The oldest of the last `per_second` calls must be a full window back.
                slot = max(now, self._granted.popleft() + self._window)
            self._granted.append(slot)
        if slot > now:
            self._sleep(slot - now)
