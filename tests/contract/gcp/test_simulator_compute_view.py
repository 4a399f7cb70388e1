"""A GCE simulator's Compute API view, read through the real Compute client (REST) as the tick of the
control plane's path reads it (functions/gcp_app/upcoming.py): each instance's
`resourceStatus.upcomingMaintenance` from the value its metadata server serves, the same notice
under the agent's id.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
import requests
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from agent.sources.gce.values import parse_upcoming_maintenance, upcoming_event
from functions.central.gce_upcoming import GceScope, upcoming_report
from functions.gcp_app.upcoming import ComputeUpcoming
from simulator import Simulator
from simulator.gce_api.project import PROJECT_ID, ZONE, instance_id
from wire.errors import PermanentError
from wire.model import EventStatus


def reader(base_url: str) -> ComputeUpcoming:
    client = compute_v1.InstancesClient(
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]  # unannotated in google-auth
        client_options={"api_endpoint": base_url},
        transport="rest",
    )
    return ComputeUpcoming(client, timeout=10.0)


def test_the_tick_reads_the_windows_the_metadata_servers_serve_as_the_agents_notices() -> None:
    # GIVEN three GCE VMs, one with a maintenance window scheduled
    with Simulator(cloud="gce", vm_names=["gce-0", "gce-1", "gce-2"]) as sim:
        control = f"{sim.base_urls[1]}/_sim"
        window = {"vm": "gce-1", "key": "upcoming-maintenance", "value": {"window_start_in": 600}}
        assert requests.post(f"{control}/gce", json=window, timeout=10).ok
        on_the_vm = requests.get(f"{control}/state", timeout=10).json()["gce"]["gce-1"]["upcoming-maintenance"]

        # WHEN the tick lists the project's instances through the Compute client
        listed = list(reader(sim.base_urls[0]).instances(GceScope(projects=(PROJECT_ID,))))

    # THEN it finds that VM only, and its notice is the one the agent reads, under the same id
    assert [instance["name"] for instance in listed] == ["gce-1"]
    report = upcoming_report(listed[0], GceScope(projects=(PROJECT_ID,), zones=(ZONE,)))
    agents = upcoming_event(
        upcoming=parse_upcoming_maintenance(json.dumps(on_the_vm)),
        status=EventStatus.SCHEDULED,
        instance_id=instance_id("gce-1"),
        reporter="gce-1",
        first_observed=datetime.now(timezone.utc),
        sequence="etag",
    )
    assert report is not None
    assert (report.event_id, report.status, report.vms) == (agents.event_id, EventStatus.SCHEDULED, ("gce-1",))


def test_another_projects_listing_is_refused_naming_the_permission() -> None:
    with (
        Simulator(cloud="gce", vm_names=["gce-0"]) as sim,
        pytest.raises(PermanentError, match=r"compute\.instances\.list"),
    ):
        list(reader(sim.base_urls[0]).instances(GceScope(projects=("someone-elses",))))
