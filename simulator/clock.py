"""The simulator's one owner of time.

Scenario and document timings are *documented seconds*: the numbers the vendors' docs give (15 minutes
of notice, 10 minutes Started, ...). The simulator runs them `speed` times faster than real time, and
`POST /_sim/clock/advance` jumps ahead on top of that. Everything else asks this clock; nothing deeper
reads the system time, so tests and the timeline agree on what "now" is.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from email.utils import formatdate
from typing import Callable


class Clock:
    """Maps documented (simulated) seconds to real time.

    `sim_now()` = (monotonic elapsed since launch) * speed + skew, where skew grows only through
    `advance()`. The wall-clock moment of a simulated instant is derived from the wall time at launch
    plus monotonic time, so it is a pure function of the skew: recomputing a NotBefore twice gives the
    same text unless the clock was advanced in between.
    """

    def __init__(
        self,
        speed: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not speed > 0:
            raise ValueError(f"speed must be a positive number, got {speed!r}")
        self.speed = float(speed)
        self._monotonic = monotonic
        self._wall = wall
        self._start_monotonic = monotonic()
        self._start_wall = wall()
        self._skew = 0.0
        self._lock = threading.Lock()

    def sim_now(self) -> float:
        """Documented seconds since launch (including every advance)."""
        with self._lock:
            skew = self._skew
        return (self._monotonic() - self._start_monotonic) * self.speed + skew

    def advance(self, seconds: float) -> None:
        """Jump `seconds` documented seconds ahead."""
        if seconds < 0:
            raise ValueError("the clock only moves forward; give seconds >= 0")
        with self._lock:
            self._skew += seconds

    def real_delay(self, sim_seconds: float) -> float:
        """Real seconds until `sim_seconds` documented seconds have passed (0 when already past)."""
        return max(0.0, sim_seconds / self.speed)

    def wall_at(self, sim_time: float) -> float:
        """The real wall-clock moment (epoch seconds) at which `sim_now()` reaches `sim_time`."""
        with self._lock:
            skew = self._skew
        return self._start_wall + (sim_time - skew) / self.speed

    def real_now(self) -> float:
        """Monotonic real seconds, for limits that are real time whatever the speed (rate limit)."""
        return self._monotonic()

    def wall_now(self) -> float:
        """The real wall-clock time now (epoch seconds), on the same scale as `wall_at`."""
        return self._start_wall + (self._monotonic() - self._start_monotonic)

    def system_now(self) -> float:
        """The system clock now (`time.time()`, full precision): the scale other processes stamp
        their own moments on (a bus's publish time), so a change can be timed across processes.
        Unlike `wall_now` it follows steps of the system clock."""
        return self._wall()


def rfc1123(epoch: float) -> str:
    """Azure's NotBefore format: 'Mon, 11 Apr 2022 22:26:58 GMT' (whole seconds, rounded down)."""
    return formatdate(int(epoch), usegmt=True)


def rfc3339(epoch: float, fraction: bool = True) -> str:
    """UTC RFC 3339 text; with `fraction` milliseconds are kept (logs), without it whole seconds (GCE)."""
    moment = datetime.fromtimestamp(epoch, tz=timezone.utc)
    if fraction:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
