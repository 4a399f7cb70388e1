"""The timeline: future state changes, run when the simulator's clock reaches them.

The Azure events, GCE changes, departures and scenario steps all schedule here; it knows none of
them, only keys, due times and actions.
"""

from __future__ import annotations

import heapq
import logging
import threading
from dataclasses import dataclass, field
from typing import Callable

from simulator.clock import Clock

LOGGER = logging.getLogger("simulator")


@dataclass(frozen=True, order=True)
class _Entry:
    at: float
    seq: int
    key: str = field(compare=False)
    label: str = field(compare=False)
    action: Callable[[float], None] = field(compare=False)


class Timeline:
    """Future state changes keyed by name, run in (time, scheduling order) order.

    An action receives its own due time, not the time it actually runs, so a clock advance that
    jumps over several entries replays them exactly as if time had passed: a start due at 960 s
    schedules its completion at 960 + 600 s even when the advance lands at 2000 s.
    """

    def __init__(self, clock: Clock, cond: threading.Condition) -> None:
        self._clock = clock
        self._cond = cond
        self._heap: list[_Entry] = []
        self._live: dict[str, _Entry] = {}
        self._seq = 0
        self._stopped = False

    def schedule(self, key: str, at: float, label: str, action: Callable[[float], None]) -> None:
        """Run `action(at)` once the clock reaches `at`; replaces any entry with the same key."""
        with self._cond:
            self._seq += 1
            entry = _Entry(at=at, seq=self._seq, key=key, label=label, action=action)
            self._live[key] = entry
            heapq.heappush(self._heap, entry)
            self._cond.notify_all()

    def cancel(self, key: str) -> None:
        with self._cond:
            self._live.pop(key, None)
            self._cond.notify_all()

    def next_due(self) -> float | None:
        with self._cond:
            self._drop_stale()
            return self._heap[0].at if self._heap else None

    def pending(self) -> list[dict[str, object]]:
        with self._cond:
            ordered = sorted(self._live.values())
            return [{"at": round(e.at, 3), "key": e.key, "what": e.label} for e in ordered]

    def run_due(self) -> int:
        """Run every entry due by now (including entries that due entries schedule); count them."""
        ran = 0
        with self._cond:
            while True:
                self._drop_stale()
                if not self._heap or self._heap[0].at > self._clock.sim_now():
                    break
                entry = heapq.heappop(self._heap)
                del self._live[entry.key]
                try:
                    entry.action(entry.at)
                except Exception:
                    # One broken entry must not stop the timeline thread (and with it every later event).
                    LOGGER.exception("timeline entry %r failed", entry.label)
                ran += 1
            if ran:
                self._cond.notify_all()
        return ran

    def run_forever(self) -> None:
        """The timeline thread: sleep on the condition until the next entry is due or anything changes."""
        with self._cond:
            while not self._stopped:
                self.run_due()
                due = self.next_due()
                timeout = None if due is None else self._clock.real_delay(due - self._clock.sim_now())
                # Any schedule(), clock advance or stop() notifies, so a far-off wait never goes stale.
                self._cond.wait(timeout)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _drop_stale(self) -> None:
        # Replaced or cancelled entries stay in the heap until they surface; skip them here.
        while self._heap and self._live.get(self._heap[0].key) is not self._heap[0]:
            heapq.heappop(self._heap)
