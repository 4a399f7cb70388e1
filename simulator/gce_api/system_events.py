"""GCE's central feed, as the simulator publishes it: the Compute Engine system-event audit log entries
of its VMs' maintenance, as a log sink delivers them to Pub/Sub (GET /_sim/central/events of a GCE
simulator; docs/simulator.md).

Google writes a System Event audit log entry for each automated action on an instance (Cloud Audit
Logs; they cannot be disabled). The entries here have the shape of Google's own fixtures of them
(GoogleCloudPlatform/iap-desktop, `Test*Event.cs`): `logName` ending
`cloudaudit.googleapis.com%2Fsystem_event`, `resource` `gce_instance` with its labels, a
`protoPayload` AuditLog naming the method and the instance, `operation` `systemevent-<ms>-...`.
The simulator writes them from the same values its VMs' metadata servers serve:

- upcoming-maintenance appears, changes or goes away: `compute.instances.upcomingMaintenance`, with
  the status message the documented alert filters match ("scheduled", "ongoing", "completed") and
  the window in `protoPayload.metadata` (the instance field's names; Google's page shows no entry).
- maintenance-event becomes MIGRATE_ON_HOST_MAINTENANCE or TERMINATE_ON_HOST_MAINTENANCE:
  `compute.instances.migrateOnHostMaintenance` / `terminateOnHostMaintenance`, written when the
  notice begins, whether or not the VM was shown it (Google writes it when the host event runs,
  up to the notice's 60 s later; an unwatched VM's skipped warning is still logged centrally).
- preempted becomes TRUE: `compute.instances.preempted`.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from simulator.clock import rfc3339
from simulator.gce_api.project import PROJECT_ID, ZONE, instance_id
from simulator.gce_api.values import MaintenanceEvent, UpcomingJson

UPCOMING = "compute.instances.upcomingMaintenance"
HAPPENING = {
    MaintenanceEvent.MIGRATE: "compute.instances.migrateOnHostMaintenance",
    MaintenanceEvent.TERMINATE: "compute.instances.terminateOnHostMaintenance",
}
PREEMPTED = "compute.instances.preempted"
UPCOMING_MESSAGES = {
    "scheduled": "Maintenance window is scheduled",
    "ongoing": "Maintenance window is ongoing",
    "completed": "Maintenance window has completed",
}


def upcoming_change(before: UpcomingJson | None, after: UpcomingJson | None) -> tuple[str, UpcomingJson] | None:
    """The upcomingMaintenance entry's message and window for a change of the value, or None when the
    change is none the log reports (a field other than the window or the status)."""
    if after is None:
        return None if before is None else (UPCOMING_MESSAGES["completed"], before)
    ongoing = after["maintenanceStatus"].upper() == "ONGOING"
    message = UPCOMING_MESSAGES["ongoing" if ongoing else "scheduled"]
    if before is not None and (
        before["windowStartTime"] == after["windowStartTime"]
        and before["maintenanceStatus"] == after["maintenanceStatus"]
    ):
        return None
    return message, after


def log_entry(
    vm: str, method: str, wall_time: float, message: str = "", window: UpcomingJson | None = None
) -> dict[str, object]:
    """A System Event audit log entry of `method` on the VM at `wall_time` (epoch seconds)."""
    payload: dict[str, object] = {
        "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
        "status": {"message": message} if message else {},
        "authenticationInfo": {"principalEmail": "system@google.com"},
        "requestMetadata": {"requestAttributes": {}, "destinationAttributes": {}},
        "serviceName": "compute.googleapis.com",
        "methodName": method,
        "resourceName": f"projects/{PROJECT_ID}/zones/{ZONE}/instances/{vm}",
        "request": {"@type": f"type.googleapis.com/{method}"},
    }
    if window is not None:
        payload["metadata"] = _metadata(window)
    millis = int(wall_time * 1000)
    return {
        "protoPayload": payload,
        "insertId": secrets.token_hex(6),
        "resource": {
            "type": "gce_instance",
            "labels": {"instance_id": instance_id(vm), "project_id": PROJECT_ID, "zone": ZONE},
        },
        "timestamp": rfc3339(wall_time),
        "severity": "INFO",
        "logName": f"projects/{PROJECT_ID}/logs/cloudaudit.googleapis.com%2Fsystem_event",
        "operation": {
            "id": f"systemevent-{millis}-{secrets.token_hex(6)}-{secrets.token_hex(4)}-{secrets.token_hex(4)}",
            "producer": method,
            "first": True,
            "last": True,
        },
        "receiveTimestamp": rfc3339(wall_time),
    }


def _metadata(window: UpcomingJson) -> Mapping[str, object]:
    # The metadata server's names and strings, as the Compute API's field has them.
    return {
        "type": window["maintenanceType"],
        "canReschedule": window["canReschedule"] == "true",
        "latestWindowStartTime": window["latestWindowStartTime"],
        "maintenanceStatus": window["maintenanceStatus"],
        "windowEndTime": window["windowEndTime"],
        "windowStartTime": window["windowStartTime"],
    }
