"""VMs that a maintenance deletes or shuts down, and so stop answering.

A started Azure Preempt (Spot eviction) or Terminate (scale-in) deletes the VMs in its Resources: in
real Azure their own agents never see the event's removal, only the VMs left behind do. A preempted
GCE VM gets about 30 seconds to shut down once `preempted` turns TRUE. The simulator lets such a VM
answer for a short grace (so a client polling once a second still sees the change), then closes its
port: connects are refused, open connections are cut, pending long-polls end without an answer.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Callable

from simulator.store import SimLog, Timeline

# Never sooner than this many real seconds after the change, whatever the speed: one poll of a
# client polling once per second, as the Azure docs recommend, sees the change before the VM goes.
MIN_ANSWERING_REAL_SECONDS = 2.0

# Closes the port of a VM that left; called under the simulator's lock, so it must not block.
Closer = Callable[[str], None]


class Departures:
    """Which VMs still answer; guarded by the simulator's shared condition."""

    def __init__(
        self, cond: threading.Condition, timeline: Timeline, log: SimLog, vm_names: Sequence[str], speed: float
    ) -> None:
        self._cond = cond
        self._timeline = timeline
        self._log = log
        self._served = frozenset(vm_names)
        self._min_delay = MIN_ANSWERING_REAL_SECONDS * speed  # in documented seconds
        self._due: dict[str, float] = {}  # VM -> documented time it stops answering
        self._gone: set[str] = set()
        self._closer: Closer | None = None

    def leave_after(self, vm: str, since: float, delay: float, why: str) -> None:
        """`vm` stops answering `delay` documented seconds after `since` (at least the real-time grace).

        Names the simulator does not serve (a Resources entry of another host) are ignored; an earlier
        departure already planned for the VM stands.
        """
        with self._cond:
            if vm not in self._served or vm in self._gone:
                return
            at = since + max(delay, self._min_delay)
            planned = self._due.get(vm)
            if planned is not None and planned <= at:
                return
            self._due[vm] = at
            self._timeline.schedule(
                _key(vm), at, f"{vm} stops answering ({why})", functools.partial(self._leave, vm, why)
            )

    def stay(self, vm: str) -> None:
        """Call off a departure that has not happened yet."""
        with self._cond:
            if self._due.pop(vm, None) is not None:
                self._timeline.cancel(_key(vm))

    def gone(self, vm: str) -> bool:
        with self._cond:
            return vm in self._gone

    def close_with(self, closer: Closer) -> None:
        """Who closes a departed VM's port; VMs gone before it was given are closed now."""
        with self._cond:
            self._closer = closer
            for vm in sorted(self._gone):
                closer(vm)

    def _leave(self, vm: str, why: str, at: float) -> None:
        with self._cond:
            self._due.pop(vm, None)
            self._gone.add(vm)
            self._log.add(f"stopped answering: {why}", vm=vm, at=at)
            self._cond.notify_all()  # its long-polls end now
            if self._closer is not None:
                self._closer(vm)


def _key(vm: str) -> str:
    return f"departure:{vm}"
