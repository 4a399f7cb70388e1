"""Per-VM GCE metadata values and how changes apply to them.

One fidelity rule lives here: GCE gives the 60-second warning only if `instance/maintenance-event`
was queried directly since the last maintenance event; an unwatched VM's maintenance happens with
the value left at NONE. A preempted VM is shut down after its 30 seconds of notice.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace

from simulator.clock import Clock, rfc3339
from simulator.departures import Departures
from simulator.gce_api.system_events import HAPPENING, PREEMPTED, UPCOMING, log_entry, upcoming_change
from simulator.gce_api.values import GceChange, GceKey, MaintenanceEvent, UpcomingJson, UpcomingPatch, VmMetadata
from simulator.store import CentralFeed, SimLog

# A Spot VM gets 30 s between ACPI G2 Soft Off and G3 Mechanical Off once preempted: then it is off.
PREEMPTED_SHUTDOWN_SECONDS = 30.0

SKIPPED_WARNING = "warning skipped: maintenance-event was not queried since the last event"

_UPCOMING_DEFAULT_START_IN = 3600.0
_UPCOMING_DEFAULT_LENGTH = 4 * 3600.0  # the documented example window is about four hours


class GceState:
    """Per-VM mutable metadata values, guarded by the simulator's shared condition."""

    def __init__(
        self,
        clock: Clock,
        cond: threading.Condition,
        log: SimLog,
        vm_names: tuple[str, ...],
        departures: Departures,
        central: CentralFeed | None = None,
    ) -> None:
        self._clock = clock
        self._cond = cond
        self._log = log
        self._vms = {vm: VmMetadata() for vm in vm_names}
        self._departures = departures
        self._central = central  # where the system-event log entries of the changes go (system_events.py)

    def get(self, vm: str) -> VmMetadata:
        with self._cond:
            return self._vms[vm]

    def vm_names(self) -> tuple[str, ...]:
        return tuple(self._vms)

    def snapshot(self) -> dict[str, dict[str, object]]:
        with self._cond:
            return {
                vm: {
                    "maintenance-event": meta.maintenance_event.value,
                    "upcoming-maintenance": dict(meta.upcoming) if meta.upcoming else None,
                    "preempted": "TRUE" if meta.preempted else "FALSE",
                    "watched": meta.watched,
                }
                for vm, meta in self._vms.items()
            }

    def mark_watched(self, vm: str) -> None:
        with self._cond:
            meta = self._vms[vm]
            if not meta.watched:
                self._vms[vm] = replace(meta, watched=True)

    def apply(self, change: GceChange, vm: str, at: float | None = None) -> bool:
        """Apply a change to one VM; False when it was swallowed (the skipped 60-second warning)."""
        now = self._clock.sim_now() if at is None else at
        with self._cond:
            meta = self._vms[vm]
            if change.key is GceKey.MAINTENANCE_EVENT:
                assert change.maintenance_event is not None
                shown = self._set_maintenance_event(vm, meta, change.maintenance_event, change.require_watch, now)
                method = HAPPENING.get(change.maintenance_event)
                if method is not None and meta.maintenance_event is MaintenanceEvent.NONE:
                    self._publish(vm, method, now)  # logged centrally even when the VM was not shown it
            elif change.key is GceKey.PREEMPTED:
                assert change.preempted is not None
                self._set_preempted(vm, meta, change, now)
                if change.preempted and not meta.preempted:
                    self._publish(vm, PREEMPTED, now)
                shown = True
            else:
                upcoming = None if change.upcoming is None else self._merge(meta.upcoming, change.upcoming, now)
                self._vms[vm] = replace(meta, upcoming=upcoming)
                if upcoming != meta.upcoming:
                    text = "removed" if upcoming is None else json.dumps(upcoming)
                    self._log.add(f"upcoming-maintenance: {text}", vm=vm, at=now)
                logged = upcoming_change(meta.upcoming, upcoming)
                if logged is not None:
                    self._publish(vm, UPCOMING, now, *logged)
                shown = True
            self._cond.notify_all()
            return shown

    def _publish(self, vm: str, method: str, now: float, message: str = "", window: UpcomingJson | None = None) -> None:
        if self._central is None:
            return
        wall_time = self._clock.wall_at(now)
        what = f"{method.rsplit('.', 1)[1]} of {vm}" + (f" ({message})" if message else "")
        self._central.publish(lambda: log_entry(vm, method, wall_time, message, window), what, now, vm=vm)

    def _set_preempted(self, vm: str, meta: VmMetadata, change: GceChange, now: float) -> None:
        self._vms[vm] = replace(meta, preempted=bool(change.preempted))
        if change.preempted == meta.preempted:
            return
        self._log.add(f"preempted: {'TRUE' if change.preempted else 'FALSE'}", vm=vm, at=now)
        if not change.preempted:
            self._departures.stay(vm)  # a rehearsal undone through the control API
        elif not change.keep_serving:
            self._departures.leave_after(vm, now, PREEMPTED_SHUTDOWN_SECONDS, "preempted, shut down")

    def _set_maintenance_event(
        self, vm: str, meta: VmMetadata, value: MaintenanceEvent, require_watch: bool, now: float
    ) -> bool:
        if value is MaintenanceEvent.NONE:
            # The maintenance is over: the VM has to query the key again to get the next warning.
            self._vms[vm] = replace(meta, maintenance_event=value, watched=False)
            if meta.maintenance_event is not MaintenanceEvent.NONE:
                self._log.add(f"maintenance-event: {meta.maintenance_event.value} -> NONE", vm=vm, at=now)
            return True
        if meta.maintenance_event is MaintenanceEvent.NONE and require_watch and not meta.watched:
            self._log.add(f"{SKIPPED_WARNING} ({value.value} not shown)", vm=vm, at=now)
            return False
        self._vms[vm] = replace(meta, maintenance_event=value)
        if value is not meta.maintenance_event:
            self._log.add(f"maintenance-event: {meta.maintenance_event.value} -> {value.value}", vm=vm, at=now)
        return True

    def _merge(self, current: UpcomingJson | None, patch: UpcomingPatch, now: float) -> UpcomingJson:
        merged: UpcomingJson = (
            current.copy()
            if current is not None
            else UpcomingJson(
                maintenanceType="SCHEDULED",
                canReschedule="true",
                latestWindowStartTime="",
                maintenanceStatus="PENDING",
                windowEndTime="",
                windowStartTime="",
            )
        )
        if current is None or patch.window_start_in is not None or patch.window_length is not None:
            start_in = _UPCOMING_DEFAULT_START_IN if patch.window_start_in is None else patch.window_start_in
            length = _UPCOMING_DEFAULT_LENGTH if patch.window_length is None else patch.window_length
            # Real wall-clock times of the compressed timeline, so deadlines downstream are truthful.
            start = rfc3339(self._clock.wall_at(now + start_in), fraction=False)
            merged["windowStartTime"] = start
            merged["latestWindowStartTime"] = start
            merged["windowEndTime"] = rfc3339(self._clock.wall_at(now + start_in + length), fraction=False)
        if patch.maintenance_type is not None:
            merged["maintenanceType"] = patch.maintenance_type
        if patch.can_reschedule is not None:
            merged["canReschedule"] = "true" if patch.can_reschedule else "false"
        if patch.maintenance_status is not None:
            merged["maintenanceStatus"] = patch.maintenance_status
        if patch.window_start_time is not None:
            merged["windowStartTime"] = patch.window_start_time
        if patch.window_end_time is not None:
            merged["windowEndTime"] = patch.window_end_time
        if patch.latest_window_start_time is not None:
            merged["latestWindowStartTime"] = patch.latest_window_start_time
        # Keep the documented key order whatever was patched.
        return UpcomingJson(
            maintenanceType=merged["maintenanceType"],
            canReschedule=merged["canReschedule"],
            latestWindowStartTime=merged["latestWindowStartTime"],
            maintenanceStatus=merged["maintenanceStatus"],
            windowEndTime=merged["windowEndTime"],
            windowStartTime=merged["windowStartTime"],
        )
