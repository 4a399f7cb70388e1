"""A timer that sends the summary of refused reports when it falls due, if nothing else does first.

A summary falls due on the first audit record or `settle` after its interval; after the last
refusal of a flood, neither may come for a long time. `SummaryWakeUp.schedule` (the core's
`on_held`) starts one timer thread for when it is due, unless one is already waiting; the thread
calls the core's `summarise_due` and ends. No thread is kept while no refusal is held.

(On Cloud Functions an instance has CPU only while it serves a request: there the timer may fire
late, and the summary goes out with the next request's `settle` at the latest.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class SummaryWakeUp:
    """Calls `target` once `delay` seconds after `schedule(delay)`, with at most one timer waiting."""

    def __init__(self, target: Callable[[], None] | None = None, name: str = "mbridge-webhook-summary-timer") -> None:
        self.target = target
        self._name = name
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def schedule(self, delay: float) -> None:
        with self._lock:
            if self._timer is not None:
                return  # one is waiting; if it fires early, the target asks for another
            self._timer = threading.Timer(delay, self._fire)
            self._timer.name = self._name
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _fire(self) -> None:
        with self._lock:
            self._timer = None  # before the target runs: it may schedule the next one
        if self.target is not None:
            self.target()
