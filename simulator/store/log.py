"""The simulator's log: every change, in order, with its documented and real times.

Served as GET /_sim/log and written to the `simulator` logger; every other part of the store writes
to it, so it depends on nothing but the clock.
"""

from __future__ import annotations

import logging
import threading
from typing import TypedDict

from simulator.clock import Clock, rfc3339

LOGGER = logging.getLogger("simulator")


class LogEntry(TypedDict):
    time: str
    sim_time: float
    unix_time: float  # the system clock when the change took effect, to the microsecond
    vm: str | None
    message: str


class SimLog:
    """What happened, in order: served as GET /_sim/log and written to the `simulator` logger."""

    def __init__(self, clock: Clock, cond: threading.Condition) -> None:
        self._clock = clock
        self._cond = cond
        self._entries: list[LogEntry] = []

    def add(self, message: str, vm: str | None = None, at: float | None = None) -> None:
        sim_time = self._clock.sim_now() if at is None else at
        # Changes are logged from inside their critical section: no client sees one before its unix_time.
        entry = LogEntry(
            time=rfc3339(self._clock.wall_now()),
            sim_time=round(sim_time, 3),
            unix_time=round(self._clock.system_now(), 6),
            vm=vm,
            message=message,
        )
        with self._cond:
            self._entries.append(entry)
        where = f" {vm}:" if vm else ""
        LOGGER.info("[sim %9.1fs]%s %s", sim_time, where, message)

    def entries(self) -> list[LogEntry]:
        with self._cond:
            return list(self._entries)
