"""GCE maintenance from the control plane: an instance's `resourceStatus.upcomingMaintenance`, as the
Compute API returns it (`instances.get`, `instances.aggregatedList`), made into a `CentralReport`
(functions/core/central.py).

The field (googleapis compute.proto, `UpcomingMaintenance`; "Manage host events across compute
instances"): `windowStartTime`, `windowEndTime`, `latestWindowStartTime` (RFC 3339),
`maintenanceStatus` PENDING or ONGOING (the page also names COMPLETE), `type`, `canReschedule`,
`maintenanceReasons`. An instance without the field has no maintenance scheduled.

One notice, one id: the agent derives the id of an upcoming-maintenance notice from the instance id
and the window's start (wire/gce_ids.py), and so does this reading of the same notice, so both are
one event. A notice without a window start is not reported from here: the agent anchors its id on
when it first saw it, which the centre cannot know, and the two would be taken for two events.

Scope: the instance's project must be one of the deployment's, and its zone one of the deployment's
zones when it names some (`GceScope`); its full identity, projects/P/zones/Z/instances/NAME (id N),
goes into the audit log. Another project's instance of the same name is not ours.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from functions.core.central import GCE_UPCOMING, CentralRefused, CentralReport
from wire.commands import MalformedCommandError, check_target
from wire.gce_ids import UPCOMING_MAINTENANCE_KEY, gce_event_id
from wire.model import Cloud, EventKind, EventStatus
from wire.timefmt import format_rfc3339, parse_rfc3339

_STATUSES = {"PENDING": EventStatus.SCHEDULED, "ONGOING": EventStatus.STARTED, "COMPLETE": EventStatus.COMPLETED}
_ZONE = re.compile(r"(?:^|/)projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)$")


@dataclass(frozen=True)
class GceScope:
    """The projects (and, when given, zones) whose instances this deployment looks after."""

    projects: tuple[str, ...]
    zones: tuple[str, ...] = ()

    def holds(self, project: str, zone: str) -> bool:
        return project in self.projects and (not self.zones or zone in self.zones)


def upcoming_report(instance: Mapping[str, Any], scope: GceScope) -> CentralReport | None:
    """The report of the instance's upcoming maintenance, or None when it has none (or none with a
    window start: see the module docstring).

    Raises:
        CentralRefused: an instance outside the deployment's scope, or a field that cannot be read.
    """
    name, instance_id = _text(instance.get("name"), "name"), _text(instance.get("id"), "id")
    where = _ZONE.search(_text(instance.get("zone"), "zone"))
    if where is None:
        raise CentralRefused(f"zone {str(instance.get('zone'))[:200]!r} is not projects/P/zones/Z")
    project, zone = where["project"], where["zone"]
    ours(scope, project, zone, name)
    status = instance.get("resourceStatus")
    upcoming = status.get("upcomingMaintenance") if isinstance(status, dict) else None
    if not upcoming:
        return None
    if not isinstance(upcoming, dict):
        raise CentralRefused("resourceStatus.upcomingMaintenance must be an object")
    start = _time(upcoming.get("windowStartTime"), "windowStartTime")
    if start is None:
        return None
    state = str(upcoming.get("maintenanceStatus", "PENDING")).upper()
    if state not in _STATUSES:
        raise CentralRefused(f"maintenanceStatus {state[:40]!r} is not one GCE documents")
    end = _time(upcoming.get("windowEndTime"), "windowEndTime")
    kind = str(upcoming.get("type", "UNKNOWN"))[:40]
    window = f"window {format_rfc3339(start)} to {format_rfc3339(end) if end else '?'}"
    return CentralReport(
        cloud=Cloud.GCE,
        event_id=gce_event_id(instance_id, UPCOMING_MAINTENANCE_KEY, start),
        kind=EventKind.UPCOMING,
        status=_STATUSES[state],
        vms=(name,),
        source=GCE_UPCOMING,
        notice_id=f"{instance_id}:{format_rfc3339(start)}:{state}",
        not_before=start,
        description=f"{kind} maintenance {state}, {window} (reported by the Compute API)",
        identities=((name, f"projects/{project}/zones/{zone}/instances/{name} (id {instance_id})"),),
    )


def ours(scope: GceScope, project: str, zone: str, name: str) -> None:
    """Refuse an instance outside the deployment's projects and zones, or with a name no command can carry.

    Raises:
        CentralRefused: naming the settings, or the name's fault.
    """
    if not scope.holds(project, zone):
        raise CentralRefused(
            f"instance {name[:63]!r} is in project {project[:100]!r}, zone {zone[:63]!r}, outside this deployment's "
            "scope (MBRIDGE_TRUST_PROJECTS, MBRIDGE_TRUST_ZONES): not ours, whatever its name"
        )
    try:
        check_target(name, "name")
    except MalformedCommandError as exc:
        raise CentralRefused(str(exc)) from exc


def _time(value: Any, name: str) -> datetime | None:
    if value in (None, ""):
        return None
    try:
        return parse_rfc3339(_text(value, name))
    except ValueError as exc:
        raise CentralRefused(f"upcomingMaintenance.{name}: {exc}") from exc


def _text(value: Any, name: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # an instance id may come as a number
    if not isinstance(value, str) or not value:
        raise CentralRefused(f"{name} must be a non-empty string")
    return value
