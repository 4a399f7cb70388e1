"""The /_sim/ control API and the Python API: views, validation, errors, ports."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import requests

from simulator import Simulator, load_scenario
from tests.contract.simulator.conftest import StartSim, VmClient, clients


def test_state_shows_vms_events_timeline_and_faults(start_sim: StartSim) -> None:
    # GIVEN two VMs and one Scheduled event
    sim = start_sim(cloud="azure", vm_names=["s-0", "s-1"], speed=2)
    vm = clients(sim)[0]
    vm.add_event(event_type="Redeploy", event_id="ST-1", notice=120, started_for=30)
    # WHEN the state is read
    state = vm.state()
    # THEN it lists the VMs with their URLs, the event with its internal timings, and what is due next
    assert state["cloud"] == "azure"
    assert state["speed"] == 2
    assert [v["url"] for v in state["vms"]] == sim.base_urls
    assert [v["document_incarnation"] for v in state["vms"]] == [2, 2]
    event = state["events"][0]
    assert event["EventId"] == "ST-1"
    assert event["sim"]["next"] == "start"
    assert event["sim"]["due_at"] - event["sim"]["added_at"] == pytest.approx(120)
    assert event["sim"]["started_for"] == 30
    assert event["sim"]["audience"] == ["s-0", "s-1"]
    assert state["timeline"] == [{"at": event["sim"]["due_at"], "key": "event:st-1", "what": "start event ST-1"}]
    assert set(state["faults"]) == {"s-0", "s-1"}
    assert state["clock"]["sim_time"] >= 0


def test_notice_and_started_for_overrides(azure: VmClient) -> None:
    # GIVEN a Terminate with 5 documented minutes of notice, staying Started 30 s, whose VM is kept
    # serving (else it is deleted and its port closed 2 s after the start) so it sees the removal
    azure.add_event(event_type="Terminate", event_id="T-1", notice=300, started_for=30, keep_serving=True)
    # WHEN time passes just short of and then past each boundary
    azure.advance(299)
    before_start = azure.events()["Events"][0]["EventStatus"]
    azure.advance(2)
    after_start = azure.events()["Events"][0]["EventStatus"]
    azure.advance(31)
    # THEN the overrides were used instead of the defaults
    assert (before_start, after_start) == ("Scheduled", "Started")
    assert azure.events()["Events"] == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "event_type"),
        ({"event_type": "Nap"}, "event_type"),
        ({"event_type": "Reboot", "status": "Completed"}, "status"),
        ({"event_type": "Reboot", "event_source": "Robot"}, "event_source"),
        ({"event_type": "Reboot", "resources": "vm-0"}, "resources"),
        ({"event_type": "Reboot", "duration_seconds": -2}, "duration_seconds"),
        ({"event_type": "Reboot", "notice": "soon"}, "notice"),
        ({"event_type": "Reboot", "audience": ["nobody"]}, "audience"),
        ({"event_type": "Reboot", "color": "red"}, "color"),
    ],
)
def test_event_bodies_are_validated(azure: VmClient, body: dict[str, object], field: str) -> None:
    # WHEN an event body is wrong
    response = azure.control("POST", "events", body)
    # THEN 400 naming the field, and nothing was added
    assert response.status_code == 400
    assert f"field '{field}'" in response.json()["error"]
    assert azure.events()["Events"] == []


def test_duplicate_event_id_is_409(azure: VmClient) -> None:
    # GIVEN an event
    azure.add_event(event_type="Reboot", event_id="DUP")
    # WHEN the same EventId (any case) is added again
    response = azure.control("POST", "events", {"event_type": "Freeze", "event_id": "dup"})
    # THEN 409
    assert response.status_code == 409


def test_control_api_errors(azure: VmClient, gce: VmClient) -> None:
    # WHEN the control API is misused
    cases = {
        "unknown GET": azure.control("GET", "nothing"),
        "unknown POST": azure.control("POST", "nothing", {}),
        "PUT": azure.control("PUT", "state"),
        "not JSON": requests.post(f"{azure.base_url}/_sim/events", data="{", timeout=5),
        "not an object": azure.control("POST", "events", [1, 2]),
        "negative advance": azure.control("POST", "clock/advance", {"seconds": -1}),
        "unknown event": azure.control("POST", "events/NOPE/advance"),
        "gce on azure": azure.control("POST", "gce", {"key": "preempted", "value": True}),
        "events on gce": gce.control("POST", "events", {"event_type": "Reboot"}),
        "bad gce key": gce.control("POST", "gce", {"key": "weather", "value": "rain"}),
        "bad upcoming": gce.control("POST", "gce", {"key": "upcoming-maintenance", "value": {"when": 1}}),
    }
    # THEN each is a JSON error with the right status
    codes = {name: response.status_code for name, response in cases.items()}
    assert codes == {
        "unknown GET": 404,
        "unknown POST": 404,
        "PUT": 405,
        "not JSON": 400,
        "not an object": 400,
        "negative advance": 400,
        "unknown event": 404,
        "gce on azure": 400,
        "events on gce": 400,
        "bad gce key": 400,
        "bad upcoming": 400,
    }
    assert all(response.json()["error"] for response in cases.values())
    assert "--cloud" in cases["gce on azure"].json()["error"]


def test_clock_advance_returns_the_new_time(azure: VmClient) -> None:
    # WHEN the clock is advanced by 900 documented seconds
    result = azure.post_ok("clock/advance", {"seconds": 900})
    # THEN the simulated time is at least that
    assert result["sim_time"] >= 900


def test_vms_get_consecutive_ports(start_sim: StartSim) -> None:
    # WHEN three VMs are served from port 0
    sim = start_sim(cloud="gce", vm_names=["p-0", "p-1", "p-2"])
    # THEN their ports are consecutive and each port answers as its own VM
    ports = [urlsplit(url).port for url in sim.base_urls]
    assert ports[0] is not None
    assert ports == [ports[0], ports[0] + 1, ports[0] + 2]
    assert [VmClient(url).gce("instance/name").text for url in sim.base_urls] == ["p-0", "p-1", "p-2"]


def test_taken_port_is_reported(start_sim: StartSim) -> None:
    # GIVEN a port in use by another simulator
    taken = urlsplit(start_sim(cloud="azure").base_urls[0]).port
    assert taken is not None
    # WHEN another simulator wants it
    other = Simulator(cloud="azure", port=taken)
    # THEN starting fails with a message that says what to do
    with pytest.raises(OSError, match="--port"):
        other.start()
    other.stop()


def test_python_api_lifecycle() -> None:
    # GIVEN a simulator that is not started
    sim = Simulator(scenario=load_scenario("gce-preempt"))
    with pytest.raises(RuntimeError, match="start"):
        _ = sim.base_urls
    # WHEN it is used as a context manager
    with sim:
        url = sim.base_urls[0]
        name = VmClient(url).gce("instance/name").text
        sim.advance_clock(60)
        preempted = VmClient(url).gce("instance/preempted").text
        log = sim.log_entries()
    # THEN it served the scenario's default VM and stopped afterwards (stop is idempotent)
    assert sim.vm_names == ["gce-spot-0"]
    assert (name, preempted) == ("gce-spot-0", "TRUE")
    assert any(entry["message"] == "preempted: TRUE" for entry in log)
    sim.stop()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/_sim/state", timeout=2)


def test_stop_ends_pending_long_polls(start_sim: StartSim) -> None:
    # GIVEN a long-poll waiting for a change that never comes
    import threading
    import time

    sim = start_sim(cloud="gce")
    vm = clients(sim)[0]
    result: list[int] = []
    poll = threading.Thread(
        target=lambda: result.append(
            vm.gce("instance/maintenance-event", params={"wait_for_change": "true", "timeout_sec": "300"}).status_code
        )
    )
    poll.start()
    time.sleep(0.3)
    # WHEN the simulator stops
    began = time.monotonic()
    sim.stop()
    poll.join(timeout=10)
    # THEN the long-poll returned promptly instead of holding stop() for 300 s
    assert not poll.is_alive()
    assert result == [200]
    assert time.monotonic() - began < 5
