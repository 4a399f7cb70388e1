"""GCE maintenance from the control plane's logs: a Compute Engine system-event audit log entry, as a
log sink delivers it to Pub/Sub, made into a `CentralReport` (functions/core/central.py).

The entries (Cloud Audit Logs, "System Event audit logs": written by Google for automated actions,
and never disabled): `logName` `projects/P/logs/cloudaudit.googleapis.com%2Fsystem_event`,
`resource` `gce_instance` with labels `instance_id`, `project_id`, `zone`, and a `protoPayload`
AuditLog whose `methodName` says what happened and `resourceName` names the instance
(`projects/P/zones/Z/instances/NAME`). The methods read here:

- `compute.instances.upcomingMaintenance`: a maintenance window was scheduled, opened or completed
  ("Manage host events across compute instances" filters these on `protoPayload.status.message`
  matching "scheduled", "ongoing" and "completed"). The window is read from
  `protoPayload.metadata` (`windowStartTime`, `windowEndTime`, `maintenanceStatus`, `type`); the
  page shows no entry, so these names are those of the instance's `upcomingMaintenance` field, as
  open-source consumers of this log read them. The window's start gives the notice the agent's id
  (wire/gce_ids.py): one notice, one event. An entry without a window start is refused: it cannot
  be joined to the notice, and the Compute API's reading of the instance covers it.
- `compute.instances.migrateOnHostMaintenance`, `terminateOnHostMaintenance`, `hostError`,
  `preempted`: the maintenance is happening now (Google-authored fixtures of these entries are in
  GoogleCloudPlatform/iap-desktop). The agent anchors its id of these on the moment it first saw
  the metadata value, which the log cannot know, so the centre's report carries an id of its own
  (from the entry's operation) and `matched_by_time`: the VM's agent reported it if it reported a
  notice of that kind near the entry's time (`core.central.agent_reported`).
- `compute.instances.automaticRestart` (the VM is back after a host error or a termination) is not
  a maintenance notice: it is passed by (None).

Scope as for the Compute API (`GceScope`): the entry's project must be a deployment's project and its
zone one of the deployment's zones when it names some; the labels and the resource name must agree.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from functions.central.gce_upcoming import GceScope, ours
from functions.core.central import GCE_SYSTEM_EVENT, CentralRefused, CentralReport
from wire.gce_ids import UPCOMING_MAINTENANCE_KEY, gce_event_id
from wire.model import Cloud, EventKind, EventStatus
from wire.timefmt import format_rfc3339, parse_rfc3339

SYSTEM_EVENT_LOG = "cloudaudit.googleapis.com%2Fsystem_event"
UPCOMING_METHOD = "compute.instances.upcomingMaintenance"
RESTART_METHOD = "compute.instances.automaticRestart"
# What is happening now, by method; the kinds are those the agent gives the same notices.
HAPPENING = {
    "compute.instances.migrateOnHostMaintenance": EventKind.LIVE_MIGRATE,
    "compute.instances.terminateOnHostMaintenance": EventKind.HOST_TERMINATE,
    "compute.instances.hostError": EventKind.HOST_TERMINATE,
    "compute.instances.preempted": EventKind.PREEMPT,
}
METHODS = (UPCOMING_METHOD, RESTART_METHOD, *HAPPENING)
# The words of the status message the documented filters match, in the order a window goes through.
_UPCOMING_WORDS = (
    ("completed", EventStatus.COMPLETED),
    ("ongoing", EventStatus.STARTED),
    ("scheduled", EventStatus.SCHEDULED),
)
_UPCOMING_STATUSES = {
    "PENDING": EventStatus.SCHEDULED,
    "ONGOING": EventStatus.STARTED,
    "COMPLETE": EventStatus.COMPLETED,
}
_RESOURCE_NAME = re.compile(r"^projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$")
_MAX_TEXT = 1024  # longer than any name, id or time; a longer field is refused, not truncated


def system_event_report(entry: Mapping[str, Any], scope: GceScope) -> CentralReport | None:
    """The report of one system-event log entry, or None for an entry that is no maintenance notice
    (an automatic restart).

    Raises:
        CentralRefused: an entry of another log or method, outside the deployment's scope, or one
            that cannot be read; the reason names the field.
    """
    log_name = _text(entry, "logName")
    if not log_name.endswith(f"/logs/{SYSTEM_EVENT_LOG}"):
        raise CentralRefused(f"logName {log_name[:200]!r} is not a system-event audit log: the sink's filter is wrong")
    payload = _object(entry, "protoPayload")
    method = _text(payload, "methodName", "protoPayload.")
    if method not in METHODS:
        raise CentralRefused(f"methodName {method[:100]!r} is not a maintenance method; known: {', '.join(METHODS)}")
    if method == RESTART_METHOD:
        return None
    resource = _object(entry, "resource")
    if resource.get("type") != "gce_instance":
        raise CentralRefused(f"resource.type {str(resource.get('type'))[:60]!r} is not gce_instance")
    labels = _object(resource, "labels", "resource.")
    project, zone = _text(labels, "project_id", "resource.labels."), _text(labels, "zone", "resource.labels.")
    instance_id = _text(labels, "instance_id", "resource.labels.")
    named = _RESOURCE_NAME.match(_text(payload, "resourceName", "protoPayload."))
    if named is None or (named["project"], named["zone"]) != (project, zone):
        raise CentralRefused(
            f"protoPayload.resourceName {str(payload.get('resourceName'))[:200]!r} is not "
            f"projects/{project[:100]}/zones/{zone[:63]}/instances/NAME, as resource.labels say"
        )
    name = named["name"]
    ours(scope, project, zone, name)
    identity = ((name, f"projects/{project}/zones/{zone}/instances/{name} (id {instance_id})"),)
    notice_id = _text(entry, "insertId")
    at = _time(entry.get("timestamp"), "timestamp")
    if method == UPCOMING_METHOD:
        return _upcoming(payload, instance_id, name, notice_id, identity)
    if at is None:
        raise CentralRefused("timestamp is missing: the report cannot be matched to the agent's notice by its moment")
    operation = entry.get("operation")
    operation_id = operation.get("id") if isinstance(operation, dict) else None
    anchor = operation_id if isinstance(operation_id, str) else notice_id
    what = method.rsplit(".", 1)[1]
    return CentralReport(
        cloud=Cloud.GCE,
        # An id of its own (see the module docstring): the instance, the method and the operation.
        event_id=hashlib.sha256(f"{instance_id}|{method}|{anchor[:_MAX_TEXT]}".encode()).hexdigest(),
        kind=HAPPENING[method],
        status=EventStatus.STARTED,
        vms=(name,),
        source=GCE_SYSTEM_EVENT,
        notice_id=notice_id,
        description=f"{what} at {format_rfc3339(at)} (reported by the system-event log)",
        identities=identity,
        matched_by_time=at,
    )


def _upcoming(
    payload: Mapping[str, Any],
    instance_id: str,
    name: str,
    notice_id: str,
    identity: tuple[tuple[str, str], ...],
) -> CentralReport:
    metadata = payload.get("metadata")
    if not isinstance(metadata, dict):
        raise CentralRefused(
            "protoPayload.metadata is missing: the window of this upcomingMaintenance entry cannot be known, so it "
            "cannot be joined to its notice (the Compute API's reading of the instance reports it)"
        )
    start = _time(metadata.get("windowStartTime"), "protoPayload.metadata.windowStartTime")
    if start is None:
        raise CentralRefused("protoPayload.metadata.windowStartTime is missing: the notice cannot be joined to its id")
    end = _time(metadata.get("windowEndTime"), "protoPayload.metadata.windowEndTime")
    status = _upcoming_status(payload, metadata)
    kind = str(metadata.get("type", "UNKNOWN"))[:40]
    window = f"window {format_rfc3339(start)} to {format_rfc3339(end) if end else '?'}"
    return CentralReport(
        cloud=Cloud.GCE,
        event_id=gce_event_id(instance_id, UPCOMING_MAINTENANCE_KEY, start),
        kind=EventKind.UPCOMING,
        status=status,
        vms=(name,),
        source=GCE_SYSTEM_EVENT,
        notice_id=notice_id,
        not_before=start,
        description=f"{kind} maintenance {status.value}, {window} (reported by the system-event log)",
        identities=identity,
    )


def _upcoming_status(payload: Mapping[str, Any], metadata: Mapping[str, Any]) -> EventStatus:
    """The documented filters read the status message; the metadata's maintenanceStatus when it has none."""
    status = payload.get("status")
    message = status.get("message") if isinstance(status, dict) else None
    if isinstance(message, str):
        lowered = message[:_MAX_TEXT].lower()
        for word, found in _UPCOMING_WORDS:
            if word in lowered:
                return found
    state = str(metadata.get("maintenanceStatus", ""))[:40].upper()
    if state in _UPCOMING_STATUSES:
        return _UPCOMING_STATUSES[state]
    raise CentralRefused(
        f"neither protoPayload.status.message ({str(message)[:80]!r}) nor metadata.maintenanceStatus ({state!r}) says "
        "whether the window is scheduled, ongoing or completed"
    )


def _object(document: Mapping[str, Any], name: str, where: str = "") -> Mapping[str, Any]:
    value = document.get(name)
    if not isinstance(value, dict):
        raise CentralRefused(f"{where}{name} must be an object")
    return value


def _text(document: Mapping[str, Any], name: str, where: str = "") -> str:
    value = document.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # an instance id may come as a number
    if not isinstance(value, str) or not value or len(value) > _MAX_TEXT:
        raise CentralRefused(f"{where}{name} must be a non-empty string of at most {_MAX_TEXT} characters")
    return value


def _time(value: Any, name: str) -> datetime | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str) or len(value) > 64:
        raise CentralRefused(f"{name} must be an RFC 3339 time")
    try:
        return parse_rfc3339(value)
    except ValueError as exc:
        raise CentralRefused(f"{name}: {exc}") from exc
