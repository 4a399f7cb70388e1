"""VMs a maintenance deletes stop answering: a started Azure Preempt or Terminate deletes the VMs in its
Resources, a preempted GCE VM is shut down. Their ports refuse connections (as an address with no VM
behind it does), so their own agents never see the event's removal; every other VM goes on as before."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import pytest
import requests

from simulator import ScenarioError, load_scenario
from tests.contract.simulator.conftest import METADATA, StartSim, VmClient, clients
from tests.contract.simulator.test_azure_lifecycle import statuses
from tests.contract.simulator.test_gce import set_value
from tests.contract.simulator.test_scenarios import write

EVENT_ID = "8C2D4E6F-1A3B-4C5D-9E7F-0A1B2C3D4E5F"
# How long closing a port may take once the simulator decided its VM is gone (real seconds).
CLOSING = 2.0


def refuses_connections(vm: VmClient) -> bool:
    """True once a TCP connect to the VM's port is refused, within CLOSING real seconds."""
    address = urlsplit(vm.base_url)
    deadline = time.monotonic() + CLOSING
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address.hostname, address.port), timeout=1):
                pass
        except ConnectionRefusedError:
            return True
        except ConnectionResetError:
            pass  # accepted by the kernel just before the port closed
        time.sleep(0.02)
    return False


def answers(vm: VmClient) -> bool:
    try:
        return vm.control("GET", "state").status_code == 200
    except requests.ConnectionError:
        return False


def deletions(vm: VmClient) -> list[tuple[str, str]]:
    return [(e["vm"], e["message"]) for e in vm.get_list("log") if "stopped answering" in e["message"]]


# --------------------------------------------------------------------------- Azure


@pytest.mark.parametrize("event_type", ["Preempt", "Terminate"])
def test_a_started_deleting_event_closes_the_ports_of_its_resources_only(start_sim: StartSim, event_type: str) -> None:
    # GIVEN three VMs of one availability set, and an event deleting the first two, seen by all
    first, second, third = clients(start_sim(cloud="azure", vm_names=["as-0", "as-1", "as-2"]))
    third.add_event(event_type=event_type, event_id=EVENT_ID, resources=["$0", "$1"], notice=60)
    # WHEN the event starts
    third.advance(60)
    # THEN every VM sees it Started: the deleted ones still answer for a moment
    assert statuses(first.events()) == statuses(second.events()) == statuses(third.events()) == [(EVENT_ID, "Started")]
    # WHEN two documented seconds pass (two real seconds at speed 1: a 1 s poller sees Started)
    third.advance(2)
    # THEN the deleted VMs' ports refuse connections, and the log says so
    assert refuses_connections(first)
    assert refuses_connections(second)
    assert [vm for vm, _ in deletions(third)] == ["as-0", "as-1"]
    assert f"deleted by {event_type} {EVENT_ID}" in deletions(third)[0][1]
    # THEN the VM that was not deleted sees the normal lifecycle: the event's removal 10 minutes later
    third.advance(600)
    assert third.events()["Events"] == []


def test_a_kept_alive_connection_of_a_deleted_vm_gets_no_answer(start_sim: StartSim) -> None:
    # GIVEN a Spot VM evicted alone, and a client on it that keeps its connection alive
    spot, other = clients(start_sim(cloud="azure", vm_names=["spot-0", "other"]))
    other.add_event(event_type="Preempt", event_id=EVENT_ID, resources=["$0"], audience=["$0"])
    session = requests.Session()

    def get() -> requests.Response:
        return session.get(
            f"{spot.base_url}/metadata/scheduledevents",
            params={"api-version": "2020-07-01"},
            headers=METADATA,
            timeout=5,
        )

    assert get().status_code == 200
    # WHEN the eviction starts and the VM is gone
    other.post_ok(f"events/{EVENT_ID}/advance", {})
    other.advance(2)
    # THEN the open connection is cut, and the next request cannot reach the VM either
    with pytest.raises(requests.ConnectionError):
        get()
    assert refuses_connections(spot)
    assert answers(other)


def test_a_deleting_event_added_already_started_closes_the_port_two_seconds_later(start_sim: StartSim) -> None:
    # GIVEN a scale-set instance and its neighbour
    doomed, neighbour = clients(start_sim(cloud="azure", vm_names=["vmss_0", "vmss_1"]))
    # WHEN a Terminate of the first appears already Started (no notice)
    neighbour.add_event(event_type="Terminate", event_id=EVENT_ID, resources=["$0"], status="Started")
    # THEN it is seen Started, and the VM is gone two documented seconds later
    assert statuses(doomed.events()) == [(EVENT_ID, "Started")]
    neighbour.advance(2)
    assert refuses_connections(doomed)
    assert statuses(neighbour.events()) == [(EVENT_ID, "Started")]


def test_keep_serving_lets_a_deleted_vm_see_its_event_removed(start_sim: StartSim) -> None:
    # GIVEN a single VM whose Terminate is added with keep_serving (a test that wants the removal)
    vm = clients(start_sim(cloud="azure"))[0]
    event = vm.add_event(event_type="Terminate", event_id=EVENT_ID, notice=60, keep_serving=True)
    # WHEN it starts and completes
    vm.advance(60)
    started = statuses(vm.events())
    vm.advance(600)
    # THEN the VM answered all along and saw the removal
    assert event["sim"]["keep_serving"] is True
    assert started == [(EVENT_ID, "Started")]
    assert vm.events()["Events"] == []
    assert deletions(vm) == []


def test_events_that_do_not_delete_their_vms_leave_the_ports_open(start_sim: StartSim) -> None:
    # GIVEN a Reboot and a Redeploy of one VM
    vm = clients(start_sim(cloud="azure"))[0]
    vm.add_event(event_type="Reboot", event_id="R-1", status="Started")
    vm.add_event(event_type="Redeploy", event_id="R-2", status="Started")
    # WHEN they run their course
    vm.advance(600)
    # THEN the VM still answers and saw both removed
    assert vm.events()["Events"] == []
    assert deletions(vm) == []


def test_the_python_api_still_drives_a_simulator_whose_every_vm_is_gone(start_sim: StartSim) -> None:
    # GIVEN the built-in Spot eviction, whose one VM is deleted at 92 documented seconds
    sim = start_sim(scenario="azure-preempt")
    vm = clients(sim)[0]
    # WHEN the clock passes the deletion
    sim.advance_clock(92)
    # THEN no port is left, yet the state, as GET /_sim/state shows it, is still at hand
    assert refuses_connections(vm)
    state: dict[str, Any] = sim.state()
    assert [e["EventStatus"] for e in state["events"]] == ["Started"]
    assert [entry["key"] for entry in state["timeline"]] == ["event:602d9444-d2cd-49c7-8624-8643e7171297"]
    assert state["vms"] == [{"name": "spot-vm-0", "url": vm.base_url, "document_incarnation": 3}]


def test_keep_serving_must_be_a_boolean(tmp_path: Path, azure: VmClient) -> None:
    # WHEN keep_serving is not true or false, in the control API or in a scenario
    refused = azure.control("POST", "events", {"event_type": "Preempt", "keep_serving": "yes"})
    gce_step = {"at": 1, "gce": {"key": "preempted", "value": "TRUE", "keep_serving": 1}}
    with pytest.raises(ScenarioError) as error:
        load_scenario(write(tmp_path, "bad.json", {"cloud": "gce", "steps": [gce_step]}))
    # THEN both name the field
    assert refused.status_code == 400
    assert "field 'keep_serving': must be true or false" in refused.json()["error"]
    assert "step 0: field 'gce.keep_serving': must be true or false" in str(error.value)


# --------------------------------------------------------------------------- GCE


def test_a_preempted_gce_vm_stops_answering_30_seconds_later(start_sim: StartSim) -> None:
    # GIVEN two GCE VMs
    spot, other = clients(start_sim(cloud="gce", vm_names=["gce-spot", "gce-other"]))
    # WHEN the first is preempted
    set_value(spot, "preempted", "TRUE")
    # THEN it reads TRUE for the 30 documented seconds GCE gives a Spot VM to shut down ...
    other.advance(29.9)
    assert spot.gce("instance/preempted").text == "TRUE"
    # ... and then its port refuses connections, while the other VM answers as before
    other.advance(0.1)
    assert refuses_connections(spot)
    assert other.gce("instance/preempted").text == "FALSE"
    assert deletions(other) == [("gce-spot", "stopped answering: preempted, shut down")]


def test_a_long_poll_of_a_preempted_vm_ends_when_it_shuts_down(start_sim: StartSim) -> None:
    # GIVEN a long-poll on maintenance-event of a VM that will be preempted
    spot, other = clients(start_sim(cloud="gce", vm_names=["gce-spot", "gce-other"]))
    etag = spot.gce("instance/maintenance-event").headers["ETag"]
    outcome: list[Any] = []
    params = {"wait_for_change": "true", "last_etag": etag, "timeout_sec": "60"}
    poll = threading.Thread(target=_capture(lambda: spot.gce("instance/maintenance-event", params=params), outcome))
    poll.start()
    time.sleep(0.2)
    # WHEN the VM is preempted and shuts down
    set_value(spot, "preempted", "TRUE")
    began = time.monotonic()
    other.advance(30)
    poll.join(timeout=10)
    # THEN the long-poll ended at once, without an answer, instead of waiting out its 60 s
    assert not poll.is_alive()
    assert time.monotonic() - began < 5
    assert isinstance(outcome[0], requests.ConnectionError)


def test_the_shutdown_waits_at_least_two_real_seconds(start_sim: StartSim) -> None:
    # GIVEN a GCE VM at a speed where 30 documented seconds last 0.15 real seconds
    spot = clients(start_sim(cloud="gce", speed=200))[0]
    # WHEN it is preempted
    set_value(spot, "preempted", "TRUE")
    began = time.monotonic()
    time.sleep(1.0)
    # THEN a client polling once a second still reads TRUE, and the VM is gone after about 2 s
    assert spot.gce("instance/preempted").text == "TRUE"
    assert refuses_connections(spot)
    assert 1.9 <= time.monotonic() - began < 1.0 + CLOSING + 0.5


def test_preempted_with_keep_serving_stays_reachable(gce: VmClient) -> None:
    # WHEN the VM is preempted with keep_serving
    set_value(gce, "preempted", "TRUE", keep_serving=True)
    gce.advance(600)
    # THEN it still answers, TRUE
    assert gce.gce("instance/preempted").text == "TRUE"
    assert deletions(gce) == []


def test_preempted_set_back_to_false_before_the_shutdown_keeps_the_vm(gce: VmClient) -> None:
    # GIVEN a preempted VM, 10 documented seconds into its shutdown
    set_value(gce, "preempted", "TRUE")
    gce.advance(10)
    # WHEN the control API sets preempted back to FALSE (a rehearsal undone)
    set_value(gce, "preempted", "FALSE")
    gce.advance(600)
    # THEN the VM is not shut down
    assert gce.gce("instance/preempted").text == "FALSE"
    assert deletions(gce) == []


def _capture(call: Callable[[], object], into: list[Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            into.append(call())
        except requests.RequestException as exc:
            into.append(exc)

    return run
