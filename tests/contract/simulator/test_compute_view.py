"""A GCE simulator's Compute API view, read through the real Compute client (REST) as the tick of the
control plane's path reads it (functions/gcp_app/upcoming.py): each instance's
`resourceStatus.upcomingMaintenance` from the value its metadata server serves, the same notice
under the agent's id.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from agent.sources.gce.values import parse_upcoming_maintenance, upcoming_event
from functions.central.gce_upcoming import GceScope, upcoming_report
from functions.gcp_app.upcoming import ComputeUpcoming
from simulator.gce_api.project import PROJECT_ID, ZONE, instance_id
from tests.contract.simulator.conftest import StartSim, clients
from wire.errors import PermanentError
from wire.model import EventStatus


def reader(base_url: str) -> ComputeUpcoming:
    client = compute_v1.InstancesClient(
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]  # unannotated in google-auth
        client_options={"api_endpoint": base_url},
        transport="rest",
    )
    return ComputeUpcoming(client, timeout=10.0)


def test_the_tick_reads_the_windows_the_metadata_servers_serve_as_the_agents_notices(start_sim: StartSim) -> None:
    # GIVEN three GCE VMs, one with a maintenance window scheduled
    vms = clients(start_sim(cloud="gce", vm_names=["gce-0", "gce-1", "gce-2"]))
    name = "gce-1"
    vms[1].post_ok("gce", {"vm": name, "key": "upcoming-maintenance", "value": {"window_start_in": 600}})
    on_the_vm = vms[1].state()["gce"][name]["upcoming-maintenance"]

    # WHEN the tick lists the project's instances through the Compute client
    listed = list(reader(vms[0].base_url).instances(GceScope(projects=(PROJECT_ID,))))

    # THEN it finds that VM only, and its notice is the one the agent reads, under the same id
    assert [instance["name"] for instance in listed] == [name]
    report = upcoming_report(listed[0], GceScope(projects=(PROJECT_ID,), zones=(ZONE,)))
    agents = upcoming_event(
        upcoming=parse_upcoming_maintenance(json.dumps(on_the_vm)),
        status=EventStatus.SCHEDULED,
        instance_id=instance_id(name),
        reporter=name,
        first_observed=datetime.now(timezone.utc),
        sequence="etag",
    )
    assert report is not None
    assert (report.event_id, report.status, report.vms) == (agents.event_id, EventStatus.SCHEDULED, (name,))


def test_another_projects_listing_is_refused_naming_the_permission(start_sim: StartSim) -> None:
    (vm,) = clients(start_sim(cloud="gce"))
    with pytest.raises(PermanentError, match=r"compute\.instances\.list"):
        list(reader(vm.base_url).instances(GceScope(projects=("someone-elses",))))
