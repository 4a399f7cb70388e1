"""An instance's `upcomingMaintenance` from the Compute API made into a central report
(functions/central/gce_upcoming.py): the same notice the agent reads from the metadata server, under the
same id.

The notice is Google's documented example ("Manage host events across compute instances", REST
response of `instances.get`: PENDING, window 2024-11-01 19:00 to 22:00 UTC).
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone
from typing import Any

import pytest

from agent.sources.gce.values import parse_upcoming_maintenance, upcoming_event
from functions.central.gce_upcoming import GceScope, upcoming_report
from functions.core.central import GCE_UPCOMING
from wire.model import Cloud, EventKind, EventStatus

UPCOMING: dict[str, Any] = {
    "canReschedule": True,
    "latestWindowStartTime": "2024-11-01T19:00:00Z",
    "maintenanceStatus": "PENDING",
    "maintenanceReasons": ["PLANNED_UPDATE", "PLANNED_NETWORK_UPDATE"],
    "type": "SCHEDULED",
    "windowEndTime": "2024-11-01T22:00:00Z",
    "windowStartTime": "2024-11-01T19:00:00Z",
}
INSTANCE: dict[str, Any] = {
    "id": "2162224123123123213",
    "name": "gce-0",
    "zone": "https://www.googleapis.com/compute/v1/projects/prod-project/zones/us-central1-a",
    "resourceStatus": {"upcomingMaintenance": UPCOMING},
}
OURS = GceScope(projects=("prod-project",))


def _instance(**upcoming: Any) -> dict[str, Any]:
    instance = copy.deepcopy(INSTANCE)
    instance["resourceStatus"]["upcomingMaintenance"].update(upcoming)
    return instance


def test_the_centres_notice_is_the_agents_notice_under_the_same_id() -> None:
    # GIVEN the notice as the Compute API returns it, and as the agent reads it on the VM (the metadata
    # server names the type maintenanceType)
    on_the_vm = {**{k: v for k, v in UPCOMING.items() if k != "type"}, "maintenanceType": "SCHEDULED"}
    agents = upcoming_event(
        upcoming=parse_upcoming_maintenance(json.dumps(on_the_vm)),
        status=EventStatus.SCHEDULED,
        instance_id=INSTANCE["id"],
        reporter="gce-0",
        first_observed=datetime(2024, 10, 30, 8, 0, tzinfo=timezone.utc),
        sequence="etag-1",
    )

    # WHEN the functions read the instance
    report = upcoming_report(INSTANCE, OURS)

    # THEN it is the same event: the same id, kind and status, for the same VM
    assert report is not None
    assert report.event_id == agents.event_id
    assert (report.cloud, report.kind, report.status, report.vms) == (
        Cloud.GCE,
        EventKind.UPCOMING,
        EventStatus.SCHEDULED,
        ("gce-0",),
    )
    assert report.source == GCE_UPCOMING
    assert report.not_before == datetime(2024, 11, 1, 19, 0, tzinfo=timezone.utc)
    assert (
        report.identity("gce-0") == "projects/prod-project/zones/us-central1-a/instances/gce-0 (id 2162224123123123213)"
    )


@pytest.mark.parametrize(
    ("status", "expected"),
    [("PENDING", EventStatus.SCHEDULED), ("ONGOING", EventStatus.STARTED), ("COMPLETE", EventStatus.COMPLETED)],
)
def test_the_maintenance_status_is_the_step(status: str, expected: EventStatus) -> None:
    report = upcoming_report(_instance(maintenanceStatus=status), OURS)
    assert report is not None
    assert report.status is expected


def test_an_instance_without_a_notice_or_without_a_window_start_reports_nothing() -> None:
    assert upcoming_report({**INSTANCE, "resourceStatus": {}}, OURS) is None
    assert upcoming_report({k: v for k, v in INSTANCE.items() if k != "resourceStatus"}, OURS) is None
    assert upcoming_report(_instance(windowStartTime=""), OURS) is None


@pytest.mark.parametrize(
    "scope",
    [GceScope(projects=("another-project",)), GceScope(projects=("prod-project",), zones=("europe-west1-b",))],
    ids=["another project", "another zone"],
)
def test_an_instance_of_another_project_or_zone_is_refused_whatever_its_name(scope: GceScope) -> None:
    with pytest.raises(match="outside this deployment's scope"):
        upcoming_report(INSTANCE, scope)


@pytest.mark.parametrize(
    ("instance", "why"),
    [
        (_instance(maintenanceStatus="PAUSED"), "maintenanceStatus 'PAUSED'"),
        (_instance(windowStartTime="soon"), "upcomingMaintenance.windowStartTime"),
        ({**INSTANCE, "zone": "us-central1-a"}, "is not projects/P/zones/Z"),
        ({**INSTANCE, "name": ""}, "name must be a non-empty string"),
    ],
    ids=["an unknown status", "a garbled window", "a bare zone", "no name"],
)
def test_what_cannot_be_read_is_refused_with_the_field_named(instance: dict[str, Any], why: str) -> None:
    with pytest.raises(match=why):
        upcoming_report(instance, OURS)
