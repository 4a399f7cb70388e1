"""Azure Scheduled Events from the control plane: an Event Grid `ScheduledEventEmitted` event, as the
system topic of `Microsoft.ResourceNotifications.MaintenanceResources` delivers it, made into a
`CentralReport` of the VMs it names (functions/core/central.py).

The event (Microsoft's "Scheduled Events in Event Grid" page and the ResourceNotifications schema,
Azure/azure-rest-api-specs `Microsoft.ResourceNotifications/stable/2018-01-01`; preview): the
scheduled event's fields in `data.resourceInfo.properties` with IMDS's names (`EventId`,
`EventStatus` — also `Completed` and `Canceled`, which IMDS never shows —, `EventType`,
`Resources`, `NotBefore` in RFC 1123 and blank once started, `DurationInSeconds`, `EventSource`,
`Description`), and in `data.resourceInfo.id` the resource it was raised on: a VM, a scale set or
an availability set, with the scheduled event's own path after it. The Event Grid schema carries
`eventType`, the CloudEvents schema `type`; both are read. `subject` differs between the page and
the schema's example, so it is not read.

Scope: the resource must be in one of the deployment's subscriptions and, when the deployment
names resource groups, one of them (`AzureScope`); each VM is the one of that name in that
resource group, `/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/N`
(a scale set's instances are named in `Resources`, as its page says). Another group's VM of the
same name is not ours.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from functions.core.central import EVENT_GRID, RESOURCE_GRAPH, CentralRefused, CentralReport
from wire.bounds import MAX_RESOURCES
from wire.commands import MalformedCommandError, check_event_id, check_target
from wire.model import Cloud, EventKind, EventSource, EventStatus
from wire.timefmt import parse_rfc1123

EVENT_TYPE = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"
_KINDS = {
    "freeze": EventKind.FREEZE,
    "reboot": EventKind.REBOOT,
    "redeploy": EventKind.REDEPLOY,
    "preempt": EventKind.PREEMPT,
    "terminate": EventKind.TERMINATE,
}
_STATUSES = {status.value: status for status in EventStatus}
_SOURCES = {"platform": EventSource.PLATFORM, "user": EventSource.USER}
_RESOURCE = re.compile(
    r"^/subscriptions/(?P<subscription>[^/]+)/resourceGroups/(?P<group>[^/]+)/providers/Microsoft\.Compute/"
    r"(?P<type>virtualMachines|virtualMachineScaleSets|availabilitySets)/(?P<name>[^/]+)"
    r"(?:/providers/Microsoft\.Maintenance/scheduledEvents/[^/]+)?$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class AzureScope:
    """The subscriptions (and, when given, resource groups) whose VMs this deployment looks after."""

    subscriptions: tuple[str, ...]
    resource_groups: tuple[str, ...] = ()

    def holds(self, subscription: str, group: str) -> bool:
        groups = {name.lower() for name in self.resource_groups}
        in_groups = not groups or group.lower() in groups
        return subscription.lower() in {name.lower() for name in self.subscriptions} and in_groups


def event_grid_report(event: Mapping[str, Any], scope: AzureScope) -> CentralReport:
    """The report of one Event Grid event (either schema) of the VMs in `scope`.

    Raises:
        CentralRefused: another event type, a field that cannot be read, or a resource outside
            the deployment's scope.
    """
    kind = event.get("eventType", event.get("type"))
    if kind != EVENT_TYPE:
        raise CentralRefused(f"event type {str(kind)[:120]!r} is not {EVENT_TYPE}: not a scheduled event")
    data = json_object(event.get("data"), "data")
    info = json_object(data.get("resourceInfo"), "data.resourceInfo")
    return scheduled_event_report(
        json_text(info.get("id"), "data.resourceInfo.id"),
        json_object(info.get("properties"), "data.resourceInfo.properties"),
        scope,
        source=EVENT_GRID,
        notice_id=str(event.get("id", ""))[:200],
    )


def scheduled_event_report(
    resource_id: str, properties: Mapping[str, Any], scope: AzureScope, *, source: str, notice_id: str = ""
) -> CentralReport:
    """The report of a scheduled event's properties raised on `resource_id` (Event Grid's
    `resourceInfo`, a Resource Graph `maintenanceresources` row's `id` and `properties`)."""
    if source not in (EVENT_GRID, RESOURCE_GRAPH):
        raise ValueError(f"{source!r} is not an Azure feed")
    where = _RESOURCE.match(resource_id)
    if where is None:
        raise CentralRefused(f"resource {resource_id[:200]!r} is not a VM, scale set or availability set")
    subscription, group = where["subscription"], where["group"]
    if not scope.holds(subscription, group):
        raise CentralRefused(
            f"resource group {group[:90]!r} of subscription {subscription[:40]!r} is not in this deployment's scope "
            "(MBRIDGE_TRUST_SUBSCRIPTIONS, MBRIDGE_TRUST_RESOURCE_GROUPS): its VMs are not ours, whatever their names"
        )
    event_id = json_text(properties.get("EventId"), "EventId")
    vms = _vms(properties.get("Resources"))
    try:
        check_event_id(event_id, "EventId")
    except MalformedCommandError as exc:
        raise CentralRefused(str(exc)) from exc
    status_text = json_text(properties.get("EventStatus"), "EventStatus").lower()
    if status_text not in _STATUSES:
        raise CentralRefused(f"EventStatus {status_text[:40]!r} is not one Azure documents")
    base = f"/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/"
    return CentralReport(
        cloud=Cloud.AZURE,
        event_id=event_id,
        kind=_KINDS.get(str(properties.get("EventType", "")).lower(), EventKind.UNKNOWN),
        status=_STATUSES[status_text],
        vms=vms,
        source=source,
        notice_id=notice_id,
        not_before=_not_before(properties.get("NotBefore")),
        duration_seconds=_duration(properties.get("DurationInSeconds")),
        event_source=_SOURCES.get(str(properties.get("EventSource", "")).lower()),
        description=str(properties.get("Description", ""))[:2048],
        identities=tuple((vm, base + vm) for vm in vms),
    )


def _vms(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise CentralRefused("Resources must be a list of the VMs' names")
    if len(value) > MAX_RESOURCES:
        raise CentralRefused(f"Resources lists {len(value)} VMs; at most {MAX_RESOURCES}")
    names = tuple(dict.fromkeys(value))
    for index, name in enumerate(names):
        if not isinstance(name, str):
            raise CentralRefused(f"Resources[{index}] is not a name")
        try:
            check_target(name, f"Resources[{index}]")
        except MalformedCommandError as exc:
            raise CentralRefused(str(exc)) from exc
    return names


def _not_before(value: Any) -> datetime | None:
    if value in (None, ""):
        return None
    try:
        return parse_rfc1123(json_text(value, "NotBefore"))
    except ValueError as exc:
        raise CentralRefused(f"NotBefore: {exc}") from exc


def _duration(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise CentralRefused(f"DurationInSeconds must be a whole number, got {repr(value)[:40]}")
    return int(value)


def json_object(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise CentralRefused(f"{name} must be an object")
    return value


def json_text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise CentralRefused(f"{name} must be a non-empty string")
    return value
