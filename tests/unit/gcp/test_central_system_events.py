"""A Compute Engine system-event audit log entry, as a log sink delivers it, made into a central report
(functions/central/gce_system_event.py).

The migration entry is the shape of Google's own fixture (GoogleCloudPlatform/iap-desktop,
TestMigrateOnHostMaintenanceEvent.cs) moved into the deployment's project; the upcomingMaintenance
entries carry the window in `protoPayload.metadata` under the instance field's names.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone
from typing import Any

import pytest

from agent.sources.gce.values import parse_upcoming_maintenance, upcoming_event
from functions.central.gce_system_event import system_event_report
from functions.central.gce_upcoming import GceScope
from functions.core.central import GCE_SYSTEM_EVENT, CentralRefused
from wire.model import Cloud, EventKind, EventStatus

PROJECT, ZONE, INSTANCE_ID = "prod-project", "us-central1-a", "2162224123123123213"
OURS = GceScope(projects=(PROJECT,))
MIGRATE: dict[str, Any] = {
    "protoPayload": {
        "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
        "status": {},
        "authenticationInfo": {},
        "requestMetadata": {"requestAttributes": {}, "destinationAttributes": {}},
        "serviceName": "compute.googleapis.com",
        "methodName": "compute.instances.migrateOnHostMaintenance",
        "resourceName": f"projects/{PROJECT}/zones/{ZONE}/instances/gce-0",
        "request": {"@type": "type.googleapis.com/compute.instances.migrateOnHostMaintenance"},
    },
    "insertId": "i1hqcte1ac2c",
    "resource": {"type": "gce_instance", "labels": {"instance_id": INSTANCE_ID, "project_id": PROJECT, "zone": ZONE}},
    "timestamp": "2019-12-19T09:17:30.375Z",
    "severity": "INFO",
    "logName": f"projects/{PROJECT}/logs/cloudaudit.googleapis.com%2Fsystem_event",
    "operation": {
        "id": "systemevent-1576746980000-59a0b03a4c100-8dcda2a6-a91dbf3a",
        "producer": "compute.instances.migrateOnHostMaintenance",
        "first": True,
        "last": True,
    },
    "receiveTimestamp": "2019-12-19T09:17:30.737702897Z",
}
WINDOW = {
    "canReschedule": True,
    "latestWindowStartTime": "2024-11-01T19:00:00Z",
    "maintenanceStatus": "PENDING",
    "type": "SCHEDULED",
    "windowEndTime": "2024-11-01T22:00:00Z",
    "windowStartTime": "2024-11-01T19:00:00Z",
}


def entry(method: str = "compute.instances.migrateOnHostMaintenance", **changes: Any) -> dict[str, Any]:
    made = copy.deepcopy(MIGRATE)
    made["protoPayload"]["methodName"] = method
    made["protoPayload"]["request"]["@type"] = f"type.googleapis.com/{method}"
    made["operation"]["producer"] = method
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = made
        for parent in parents:
            node = node[parent]
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return made


def upcoming(message: str, **window: Any) -> dict[str, Any]:
    return entry(
        "compute.instances.upcomingMaintenance",
        protoPayload__status={"message": message},
        protoPayload__metadata={**WINDOW, **window},
    )


def test_a_migration_is_reported_as_happening_with_an_id_of_its_own_and_its_moment() -> None:
    report = system_event_report(MIGRATE, OURS)

    assert report is not None
    assert (report.cloud, report.kind, report.status, report.vms) == (
        Cloud.GCE,
        EventKind.LIVE_MIGRATE,
        EventStatus.STARTED,
        ("gce-0",),
    )
    assert report.source == GCE_SYSTEM_EVENT
    assert report.notice_id == "i1hqcte1ac2c"
    # The agent's id of this notice is anchored on when it saw the value: the report is matched by time.
    assert report.matched_by_time == datetime(2019, 12, 19, 9, 17, 30, 375000, tzinfo=timezone.utc)
    assert report.identity("gce-0") == f"projects/{PROJECT}/zones/{ZONE}/instances/gce-0 (id {INSTANCE_ID})"
    # The same entry delivered twice is the same event; another operation is another.
    assert system_event_report(copy.deepcopy(MIGRATE), OURS) == report
    other = system_event_report(entry(operation__id="systemevent-1576746990000-1-2-3"), OURS)
    assert other is not None
    assert other.event_id != report.event_id


@pytest.mark.parametrize(
    ("method", "kind"),
    [
        ("compute.instances.terminateOnHostMaintenance", EventKind.HOST_TERMINATE),
        ("compute.instances.hostError", EventKind.HOST_TERMINATE),
        ("compute.instances.preempted", EventKind.PREEMPT),
    ],
)
def test_each_happening_method_has_the_kind_the_agent_gives_it(method: str, kind: EventKind) -> None:
    report = system_event_report(entry(method), OURS)
    assert report is not None
    assert (report.kind, report.status) == (kind, EventStatus.STARTED)


def test_an_automatic_restart_is_no_maintenance_notice() -> None:
    assert system_event_report(entry("compute.instances.automaticRestart"), OURS) is None


@pytest.mark.parametrize(
    ("message", "status"),
    [
        ("Maintenance window is scheduled", EventStatus.SCHEDULED),
        ("Maintenance window is ongoing", EventStatus.STARTED),
        ("Maintenance window has completed", EventStatus.COMPLETED),
    ],
)
def test_a_maintenance_window_is_the_agents_notice_under_the_same_id(message: str, status: EventStatus) -> None:
    # GIVEN the notice as the agent reads it on the VM (the metadata server names the type maintenanceType)
    on_the_vm = {**{k: v for k, v in WINDOW.items() if k != "type"}, "maintenanceType": "SCHEDULED"}
    agents = upcoming_event(
        upcoming=parse_upcoming_maintenance(json.dumps(on_the_vm)),
        status=EventStatus.SCHEDULED,
        instance_id=INSTANCE_ID,
        reporter="gce-0",
        first_observed=datetime(2024, 10, 30, 8, 0, tzinfo=timezone.utc),
        sequence="etag-1",
    )

    report = system_event_report(upcoming(message), OURS)

    assert report is not None
    assert (report.event_id, report.kind, report.status) == (agents.event_id, EventKind.UPCOMING, status)
    assert report.matched_by_time is None  # joined by id
    assert report.not_before == datetime(2024, 11, 1, 19, 0, tzinfo=timezone.utc)


def test_without_a_status_message_the_metadatas_status_says_it() -> None:
    report = system_event_report(upcoming("", maintenanceStatus="ONGOING"), OURS)
    assert report is not None
    assert report.status is EventStatus.STARTED


@pytest.mark.parametrize(
    ("broken", "says"),
    [
        (entry(logName=f"projects/{PROJECT}/logs/cloudaudit.googleapis.com%2Factivity"), "not a system-event"),
        (entry("compute.instances.setMetadata"), "not a maintenance method"),
        (entry(resource__labels__project_id="other-project"), "as resource.labels say"),
        (entry(protoPayload__resourceName="projects/other/zones/z/instances/gce-0"), "as resource.labels say"),
        (entry(resource__type="gce_disk"), "gce_instance"),
        (entry(protoPayload__resourceName=f"projects/{PROJECT}/zones/{ZONE}/instances/x" * 40), "at most"),
        (entry(insertId=None), "insertId"),
        (entry(timestamp="yesterday"), "timestamp"),
        (entry(timestamp=None), "timestamp is missing"),
        (entry(protoPayload=["not", "an", "object"]), "protoPayload must be an object"),
        (upcoming("Maintenance window is scheduled", windowStartTime=None), "windowStartTime"),
        (entry("compute.instances.upcomingMaintenance"), "metadata is missing"),
        (upcoming("", maintenanceStatus="LATER"), "scheduled, ongoing or completed"),
    ],
)
def test_an_entry_that_cannot_be_read_is_refused_with_the_field_named(broken: dict[str, Any], says: str) -> None:
    with pytest.raises(CentralRefused, match=says):
        system_event_report(broken, OURS)


def test_another_projects_instance_of_the_same_name_is_not_ours() -> None:
    theirs = copy.deepcopy(MIGRATE)
    theirs["resource"]["labels"]["project_id"] = "their-project"
    theirs["protoPayload"]["resourceName"] = f"projects/their-project/zones/{ZONE}/instances/gce-0"
    theirs["logName"] = "projects/their-project/logs/cloudaudit.googleapis.com%2Fsystem_event"

    with pytest.raises(CentralRefused, match="outside this deployment's scope"):
        system_event_report(theirs, OURS)
    with pytest.raises(CentralRefused, match="outside this deployment's scope"):
        system_event_report(MIGRATE, GceScope(projects=(PROJECT,), zones=("europe-west1-b",)))
