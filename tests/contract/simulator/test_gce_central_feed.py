"""GCE's central feed over real HTTP: GET /_sim/central/events of a GCE simulator delivers the
Compute Engine system-event audit log entries of its VMs' maintenance, as a log sink would, and the
functions read each of them into the same event the VM's agent reports.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import requests

from agent.sources.gce.values import parse_upcoming_maintenance, upcoming_event
from functions.central.gce_system_event import system_event_report
from functions.central.gce_upcoming import GceScope
from simulator.gce_api.project import PROJECT_ID, ZONE, instance_id
from tests.contract.simulator.conftest import TIMEOUT, StartSim, VmClient, clients
from wire.model import EventKind, EventStatus

SCOPE = GceScope(projects=(PROJECT_ID,), zones=(ZONE,))


def entries(vm: VmClient) -> list[dict[str, Any]]:
    response = requests.get(f"{vm.base_url}/_sim/central/events", params={"limit": 1000}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    page = response.json()["events"]
    assert [entry["seq"] for entry in page] == list(range(1, len(page) + 1))
    return [entry["event"] for entry in page]


def set_value(vm: VmClient, key: str, value: object, **more: object) -> None:
    vm.post_ok("gce", {"key": key, "value": value, **more})


def test_a_maintenance_window_is_logged_scheduled_ongoing_and_completed_as_the_agents_notice(gce: VmClient) -> None:
    # GIVEN a window scheduled on the VM, then opened, then over
    set_value(gce, "upcoming-maintenance", {"window_start_in": 600, "window_length": 3600})
    on_the_vm = gce.state()["gce"]["gce-vm-0"]["upcoming-maintenance"]
    set_value(gce, "upcoming-maintenance", {"maintenanceStatus": "ONGOING"})
    set_value(gce, "upcoming-maintenance", None)

    # WHEN the functions read the feed
    logged = entries(gce)
    reports = [system_event_report(entry, SCOPE) for entry in logged]

    # THEN three entries of the documented log, each the agent's notice under its id
    assert [entry["protoPayload"]["methodName"] for entry in logged] == ["compute.instances.upcomingMaintenance"] * 3
    assert all(entry["logName"].endswith("/logs/cloudaudit.googleapis.com%2Fsystem_event") for entry in logged)
    agents = upcoming_event(
        upcoming=parse_upcoming_maintenance(json.dumps(on_the_vm)),
        status=EventStatus.SCHEDULED,
        instance_id=instance_id("gce-vm-0"),
        reporter="gce-vm-0",
        first_observed=datetime.now(timezone.utc),
        sequence="etag",
    )
    assert [(r.event_id, r.kind, r.status, r.vms) for r in reports if r is not None] == [
        (agents.event_id, EventKind.UPCOMING, status, ("gce-vm-0",))
        for status in (EventStatus.SCHEDULED, EventStatus.STARTED, EventStatus.COMPLETED)
    ]


def test_a_migration_the_vm_was_not_shown_is_still_logged_centrally(gce: VmClient) -> None:
    # GIVEN a VM that never queried maintenance-event: GCE skips its 60-second warning
    response = gce.control("POST", "gce", {"key": "maintenance-event", "value": "MIGRATE_ON_HOST_MAINTENANCE"})
    assert response.json()["shown"] is False

    # THEN the control plane's log has the migration all the same
    (entry,) = entries(gce)
    report = system_event_report(entry, SCOPE)
    assert report is not None
    assert (report.kind, report.status, report.vms) == (EventKind.LIVE_MIGRATE, EventStatus.STARTED, ("gce-vm-0",))
    assert report.matched_by_time is not None


def test_a_preemption_is_logged_once(start_sim: StartSim) -> None:
    vm = clients(start_sim(cloud="gce"))[0]
    set_value(vm, "preempted", "TRUE", keep_serving=True)
    set_value(vm, "preempted", "TRUE", keep_serving=True)  # no change: nothing more is logged

    (entry,) = entries(vm)
    assert entry["protoPayload"]["methodName"] == "compute.instances.preempted"
    assert entry["resource"]["labels"] == {
        "instance_id": instance_id("gce-vm-0"),
        "project_id": PROJECT_ID,
        "zone": ZONE,
    }


def test_the_feeds_faults_apply_to_the_log_entries(gce: VmClient) -> None:
    # GIVEN the feed off, then every second entry delivered twice
    gce.post_ok("faults", {"central_off": True})
    set_value(gce, "upcoming-maintenance", {"window_start_in": 600})
    assert entries(gce) == []
    gce.post_ok("faults", {"central_off": False, "central_duplicates": 2})
    set_value(gce, "upcoming-maintenance", {"maintenanceStatus": "ONGOING"})
    set_value(gce, "upcoming-maintenance", None)

    # THEN the lost one stays lost, and the duplicate is the same entry byte for byte
    logged = entries(gce)
    assert len(logged) == 3
    assert logged[1] == logged[2]
    assert logged[1]["protoPayload"]["status"]["message"] == "Maintenance window has completed"
    assert gce.state()["central"]["faults"]["central_duplicates"] == 2
