"""The Compute Engine API's view of a GCE simulator's instances, read-only (GET /compute/v1/...): what a
function of the control plane's path reads (`instances.aggregatedList`, `instances.list`,
`instances.get`), with each instance's `resourceStatus.upcomingMaintenance` from the same value its
metadata server serves (docs/simulator.md, "Compute API view").

The field (googleapis compute.proto, `UpcomingMaintenance`; "Manage host events across compute
instances"): `type`, `canReschedule` (a boolean here, a string on the metadata server),
`latestWindowStartTime`, `maintenanceStatus`, `windowStartTime`, `windowEndTime`; an instance with
no maintenance scheduled has no field. A VM that has left (deleted, preempted and shut down) is
`TERMINATED`. Any VM's port answers it: the API is the project's, not a VM's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from simulator.gce_api.project import PROJECT_ID, ZONE, instance_id
from simulator.gce_api.state import GceState
from simulator.gce_api.values import UpcomingJson
from simulator.store import MetadataRequest, Response

COMPUTE_PREFIX = "/compute/v1/"
BASE = "https://www.googleapis.com/compute/v1"
_AGGREGATED = re.compile(r"^projects/(?P<project>[^/]+)/aggregated/instances$")
_ZONAL = re.compile(r"^projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances(?:/(?P<name>[^/]+))?$")


class ComputeView:
    """Answers GET /compute/v1/ for the simulator's project."""

    def __init__(self, state: GceState, gone: Callable[[str], bool]) -> None:
        self._state = state
        self._gone = gone

    def handle(self, request: MetadataRequest) -> Response:
        if request.method != "GET":
            return _error(
                405, "badRequest", f"{request.method} is not served: the simulator's Compute API is read-only"
            )
        path = request.path[len(COMPUTE_PREFIX) :].strip("/")
        aggregated, zonal = _AGGREGATED.match(path), _ZONAL.match(path)
        matched = aggregated or zonal
        if matched is None:
            return _error(404, "notFound", f"The resource '{path}' was not found")
        project = matched["project"]
        if project != PROJECT_ID:
            return _error(403, "forbidden", f"Required 'compute.instances.list' permission for 'projects/{project}'")
        instances = [self._instance(vm) for vm in self._state.vm_names()]
        if aggregated is not None:
            return _json(
                200,
                {
                    "kind": "compute#instanceAggregatedList",
                    "id": f"projects/{project}/aggregated/instances",
                    "items": {f"zones/{ZONE}": {"instances": instances}},
                },
            )
        assert zonal is not None
        if zonal["zone"] != ZONE:
            return _error(404, "notFound", f"The resource 'projects/{project}/zones/{zonal['zone']}' was not found")
        if zonal["name"] is None:
            return _json(200, {"kind": "compute#instanceList", "id": f"projects/{project}/zones/{ZONE}/instances",
                               "items": instances})  # fmt: skip
        found = [instance for instance in instances if instance["name"] == zonal["name"]]
        if not found:
            return _error(404, "notFound", f"The resource '{path}' was not found")
        return _json(200, found[0])

    def _instance(self, vm: str) -> dict[str, Any]:
        zone = f"{BASE}/projects/{PROJECT_ID}/zones/{ZONE}"
        instance: dict[str, Any] = {
            "kind": "compute#instance",
            "id": instance_id(vm),
            "name": vm,
            "zone": zone,
            "status": "TERMINATED" if self._gone(vm) else "RUNNING",
            "selfLink": f"{zone}/instances/{vm}",
        }
        upcoming = self._state.get(vm).upcoming
        if upcoming is not None:
            instance["resourceStatus"] = {"upcomingMaintenance": upcoming_field(upcoming)}
        return instance


def upcoming_field(value: UpcomingJson) -> dict[str, Any]:
    """The instance field of the metadata server's upcoming-maintenance value."""
    field: dict[str, Any] = {
        "type": value["maintenanceType"],
        "canReschedule": value["canReschedule"] == "true",
        "maintenanceStatus": value["maintenanceStatus"],
    }
    for name in ("latestWindowStartTime", "windowStartTime", "windowEndTime"):
        if value[name]:
            field[name] = value[name]
    return field


def _json(status: int, document: dict[str, Any]) -> Response:
    return Response(status=status, body=json.dumps(document).encode())


def _error(status: int, reason: str, message: str) -> Response:
    # The shape of Google's API errors, which the client libraries read.
    return _json(
        status, {"error": {"code": status, "message": message, "errors": [{"reason": reason, "message": message}]}}
    )
