"""Who asked what, how fast: per-VM counts of metadata requests by status, and the highest
number of requests in any one real second. It is how tests and benchmarks prove that a
client stays under IMDS's 5 requests/s and backs off when refused."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, TypedDict

_KEEP = 100_000  # request times kept per VM for the rate window


class VmTraffic(TypedDict):
    total: int
    by_status: dict[str, int]  # "200", "429", ..., "dropped"
    max_per_second: int


class TrafficLog:
    def __init__(self, vm_names: tuple[str, ...], monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._times: dict[str, deque[float]] = {vm: deque(maxlen=_KEEP) for vm in vm_names}
        self._by_status: dict[str, dict[str, int]] = {vm: {} for vm in vm_names}

    def record(self, vm: str, status: int | None) -> None:
        """One metadata request and its answer (None: the connection was dropped)."""
        key = "dropped" if status is None else str(status)
        with self._lock:
            self._times[vm].append(self._monotonic())
            counts = self._by_status[vm]
            counts[key] = counts.get(key, 0) + 1

    def snapshot(self) -> dict[str, VmTraffic]:
        with self._lock:
            return {
                vm: VmTraffic(
                    total=len(times),
                    by_status=dict(self._by_status[vm]),
                    max_per_second=_max_in_window(times, 1.0),
                )
                for vm, times in self._times.items()
            }


def _max_in_window(times: deque[float], window: float) -> int:
    best = 0
    start = 0
    ordered = list(times)
    for end, moment in enumerate(ordered):
        while moment - ordered[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best
