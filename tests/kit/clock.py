"""The one fake clock: still until a test moves it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

START = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


class FakeClock:
    """A manual clock for every shape of clock the code takes: `agent.timing.Clock` (itself), a wall
    clock (`clock.now`), a monotonic or elapsed-time clock (`clock.monotonic`), and a sleep
    (`clock.sleep`). Both readings move together and only when told, so a test says exactly how much
    time passed.
    """

    def __init__(self, start: datetime = START, monotonic: float = 0.0) -> None:
        if start.tzinfo is None:
            raise ValueError("the clock reads aware UTC times: give it an aware start")
        self._now = start
        self._monotonic = monotonic
        self.slept = 0.0  # seconds asked of `sleep`, all told

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, by: float | timedelta) -> None:
        seconds = by.total_seconds() if isinstance(by, timedelta) else float(by)
        if seconds < 0:
            raise ValueError("time does not run backwards")
        self._now += timedelta(seconds=seconds)
        self._monotonic += seconds

    def advance_to(self, at: datetime) -> None:
        self.advance(at - self._now)

    def sleep(self, seconds: float) -> None:
        self.slept += seconds
        self.advance(seconds)
