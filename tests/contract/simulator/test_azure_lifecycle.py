"""Azure event lifecycle over real HTTP: incarnations, approval, cancellation, hardware failure, sharing."""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime
from typing import Any

import pytest

from simulator.scenarios import LIVE_MIGRATION_EVENT_ID
from tests.contract.simulator.conftest import StartSim, VmClient, clients


def wait_for(vm: VmClient, predicate: Any, timeout: float = 5.0) -> dict[str, Any]:
    """Poll the document until `predicate(document)` holds; fail after `timeout` real seconds."""
    deadline = time.monotonic() + timeout
    while True:
        document = vm.events()
        if predicate(document):
            return document
        assert time.monotonic() < deadline, f"condition not reached; last document: {document}"
        time.sleep(0.02)


def statuses(document: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["EventId"], e["EventStatus"]) for e in document["Events"]]


def seconds_until(not_before: str) -> float:
    return parsedate_to_datetime(not_before).timestamp() - time.time()


# --------------------------------------------------------------------------- DocumentIncarnation


def test_incarnation_starts_at_one_and_is_stable_while_nothing_changes(azure: VmClient) -> None:
    # GIVEN a fresh simulator
    # WHEN the document is read several times, with documented time passing
    first = azure.events()
    azure.advance(30)
    second = azure.events()
    # THEN it is incarnation 1 with no events each time
    assert first == second == {"DocumentIncarnation": 1, "Events": []}


def test_incarnation_increments_by_one_on_every_change(azure: VmClient) -> None:
    # GIVEN an empty document (incarnation 1)
    assert azure.events()["DocumentIncarnation"] == 1
    # WHEN an event is added, its NotBefore moves (clock advance), it starts, and it completes
    azure.add_event(event_type="Redeploy", event_id="AAAA")
    added = azure.events()
    azure.advance(100)
    moved = azure.events()
    azure.advance(500)
    started = azure.events()
    azure.advance(600)
    completed = azure.events()
    # THEN each visible change is exactly one more incarnation
    assert [d["DocumentIncarnation"] for d in (added, moved, started, completed)] == [2, 3, 4, 5]
    assert added["Events"][0]["NotBefore"] != moved["Events"][0]["NotBefore"]
    assert statuses(started) == [("AAAA", "Started")]
    assert completed["Events"] == []


def test_live_migration_scenario_end_to_end(start_sim: StartSim) -> None:
    # GIVEN the documented live-migration example on its two VMs
    sim = start_sim(scenario="azure-live-migration")
    west0, west1 = clients(sim)
    assert sim.vm_names == ["WestNO_0", "WestNO_1"]
    seen: list[dict[str, Any]] = [west0.events()]
    # WHEN documented time passes: to the event (60 s), to NotBefore (15 min), to completion (10 min)
    for seconds in (60, 900, 600):
        west0.advance(seconds)
        seen.append(west0.events())
        # THEN both VMs always see the same document
        assert west1.events() == seen[-1]
    # THEN the client sees the four documents of the docs: empty, Scheduled, Started, empty
    assert [d["DocumentIncarnation"] for d in seen] == [1, 2, 3, 4]
    assert [statuses(d) for d in seen] == [
        [],
        [(LIVE_MIGRATION_EVENT_ID, "Scheduled")],
        [(LIVE_MIGRATION_EVENT_ID, "Started")],
        [],
    ]
    scheduled, started = seen[1]["Events"][0], seen[2]["Events"][0]
    assert scheduled == {
        "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
        "EventStatus": "Scheduled",
        "EventType": "Freeze",
        "ResourceType": "VirtualMachine",
        "Resources": ["WestNO_0", "WestNO_1"],
        "NotBefore": scheduled["NotBefore"],
        "Description": "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
        "EventSource": "Platform",
        "DurationInSeconds": 5,
    }
    assert started == {**scheduled, "EventStatus": "Started", "NotBefore": ""}


def test_not_before_is_the_real_moment_of_the_automatic_start(start_sim: StartSim) -> None:
    # GIVEN a simulator running 60 times faster than documented
    vm = clients(start_sim(cloud="azure", speed=60))[0]
    # WHEN a Freeze (15 documented minutes of notice) is added
    vm.add_event(event_type="Freeze", event_id="F1")
    not_before = vm.events()["Events"][0]["NotBefore"]
    # THEN NotBefore is 15 real seconds ahead (RFC 1123, whole seconds), not 15 minutes
    assert 13.0 <= seconds_until(not_before) <= 16.0


def test_clock_advance_moves_not_before_closer(azure: VmClient) -> None:
    # GIVEN a Reboot with 15 minutes of notice at speed 1
    azure.add_event(event_type="Reboot", event_id="R1")
    before = azure.events()["Events"][0]["NotBefore"]
    # WHEN 5 documented minutes are skipped
    azure.advance(300)
    after = azure.events()["Events"][0]["NotBefore"]
    # THEN the shown start is 5 minutes earlier, and still in the future
    assert seconds_until(before) - seconds_until(after) == pytest.approx(300, abs=1.5)
    assert seconds_until(after) > 590


def test_scheduled_event_starts_by_itself_at_not_before(start_sim: StartSim) -> None:
    # GIVEN a Preempt (30 documented seconds of notice) at speed 30: one real second
    vm = clients(start_sim(cloud="azure", speed=30))[0]
    vm.add_event(event_type="Preempt", event_id="P1")
    assert statuses(vm.events()) == [("P1", "Scheduled")]
    # WHEN nobody approves and real time passes
    document = wait_for(vm, lambda d: statuses(d) == [("P1", "Started")])
    # THEN the same event is Started with NotBefore blank
    assert document["Events"][0]["NotBefore"] == ""


def test_started_events_stay_at_least_two_real_seconds(start_sim: StartSim) -> None:
    # GIVEN a speed at which 10 documented minutes would last 0.6 real seconds
    vm = clients(start_sim(cloud="azure", speed=1000))[0]
    # WHEN an event starts (here: added already Started)
    event = vm.add_event(event_type="Reboot", event_id="H1", status="Started")
    time.sleep(1.0)
    # THEN a 1 s poller still sees it after one real second, and it is due after 2 real seconds
    assert statuses(vm.events()) == [("H1", "Started")]
    assert event["sim"]["due_at"] - event["sim"]["started_at"] == pytest.approx(2000, abs=1)
    wait_for(vm, lambda d: d["Events"] == [], timeout=5)


# --------------------------------------------------------------------------- approval


def test_approval_starts_the_same_event_within_seconds(start_sim: StartSim) -> None:
    # GIVEN a Reboot at speed 60: 15 real seconds of notice, approval delay 3/60 s
    vm = clients(start_sim(cloud="azure", speed=60))[0]
    vm.add_event(event_type="Reboot", event_id="5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7")
    began = time.monotonic()
    # WHEN the VM approves it
    response = vm.approve("5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7")
    # THEN 200, and the same EventId turns Started with a blank NotBefore long before its notice ran out
    assert response.status_code == 200
    document = wait_for(vm, lambda d: statuses(d) == [("5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7", "Started")])
    assert time.monotonic() - began < 10.0
    assert document["Events"][0]["NotBefore"] == ""


def test_second_approval_and_approval_of_a_started_event_are_200(azure: VmClient) -> None:
    # GIVEN a Scheduled Redeploy, approved once (it starts 3 documented seconds later)
    azure.add_event(event_type="Redeploy", event_id="R-1")
    assert azure.approve("R-1").status_code == 200
    # WHEN it is approved again, then again once Started
    again = azure.approve("R-1")
    azure.advance(3)
    assert statuses(azure.events()) == [("R-1", "Started")]
    after_start = azure.approve("R-1")
    # THEN both answers are 200 ("the service always returns 200 if it's passed a valid event ID")
    assert again.status_code == 200
    assert after_start.status_code == 200
    outcomes = [(a["status"], a["outcome"]) for a in azure.get_list("approvals")]
    assert outcomes == [(200, "accepted"), (200, "already-approved"), (200, "already-started")]


def test_event_id_match_is_case_insensitive(azure: VmClient) -> None:
    # GIVEN an event with an uppercase GUID
    azure.add_event(event_type="Freeze", event_id="C7061BAC-AFDC-4513-B24B-AA5F13A16123")
    # WHEN it is approved with the lowercase spelling
    response = azure.approve("c7061bac-afdc-4513-b24b-aa5f13a16123")
    azure.advance(3)
    # THEN it is accepted and starts
    assert response.status_code == 200
    assert statuses(azure.events()) == [("C7061BAC-AFDC-4513-B24B-AA5F13A16123", "Started")]


def test_malformed_approvals_are_400_apply_nothing_and_are_logged(start_sim: StartSim) -> None:
    # GIVEN a Scheduled event
    sim = start_sim(cloud="azure")
    vm = clients(sim)[0]
    vm.add_event(event_type="Reboot", event_id="KNOWN")
    # WHEN approvals arrive whose body or header is malformed: not JSON, no StartRequests list,
    # an entry without a (non-empty) string EventId, no Metadata header
    attempts = [
        vm.approve(body="not json"),
        vm.approve(body='{"Other": []}'),
        vm.approve(body='{"StartRequests": {"EventId": "KNOWN"}}'),
        vm.approve(body='{"StartRequests": [{"EventId": 7}]}'),
        vm.approve(body='{"StartRequests": [{"EventId": "KNOWN"}, {}]}'),
        vm.approve(body='{"StartRequests": [{"EventId": ""}]}'),
        vm.approve("KNOWN", headers={}),
    ]
    # THEN every one is 400 ("the request header or payload was malformed") and nothing was applied
    assert [r.status_code for r in attempts] == [400] * 7
    vm.advance(10)
    assert statuses(vm.events()) == [("KNOWN", "Scheduled")]
    # THEN every attempt is in the approval log with its outcome (HTTP and Python API agree)
    log = vm.get_list("approvals")
    assert [(a["status"], a["outcome"]) for a in log] == [(400, "malformed")] * 6 + [(400, "missing-header")]
    assert all(a["vm"] == "vm-0" and a["source"] == "http" and a["time"].endswith("Z") for a in log)
    assert sim.approvals() == log


def test_a_well_formed_approval_of_an_unknown_event_id_is_200_and_changes_nothing(start_sim: StartSim) -> None:
    # GIVEN a Scheduled event
    sim = start_sim(cloud="azure")
    vm = clients(sim)[0]
    vm.add_event(event_type="Reboot", event_id="KNOWN")
    before = vm.events()
    # WHEN a well-formed POST names an EventId IMDS does not know, or names none at all
    unknown = vm.approve("0B5E1F3C-9D2A-4C7B-8E6F-1A2B3C4D5E6F")
    empty = vm.approve(body='{"StartRequests": []}')
    # THEN both are 200 ("always returns a 200 ... 400 ... malformed"), and nothing changed
    assert (unknown.status_code, empty.status_code) == (200, 200)
    assert vm.events() == before
    assert vm.state()["events"][0]["sim"]["approved_at"] is None
    # THEN the log says why nothing happened
    log = vm.get_list("approvals")
    assert [(a["status"], a["outcome"], a["event_ids"]) for a in log] == [
        (200, "unknown-event", ["0B5E1F3C-9D2A-4C7B-8E6F-1A2B3C4D5E6F"]),
        (200, "unknown-event", []),
    ]


def test_a_known_event_id_next_to_an_unknown_one_is_approved(azure: VmClient) -> None:
    # GIVEN a Scheduled event
    azure.add_event(event_type="Reboot", event_id="KNOWN")
    # WHEN one POST names it together with an EventId IMDS does not know
    response = azure.approve("UNKNOWN", "KNOWN")
    azure.advance(3)
    # THEN 200, the known event starts, and the unknown id is ignored
    assert response.status_code == 200
    assert statuses(azure.events()) == [("KNOWN", "Started")]
    assert [(a["status"], a["outcome"]) for a in azure.get_list("approvals")] == [(200, "accepted")]


# --------------------------------------------------------------------------- cancel, advance, hardware failure


def test_cancel_removes_a_scheduled_event_and_refuses_a_started_one(azure: VmClient) -> None:
    # GIVEN two Scheduled events
    azure.add_event(event_type="Redeploy", event_id="CANCEL-ME")
    azure.add_event(event_type="Reboot", event_id="STARTED")
    azure.post_ok("events/STARTED/advance", {})
    before = azure.events()
    # WHEN the Scheduled one is canceled and the Started one too
    canceled = azure.control("POST", "events/CANCEL-ME/cancel")
    refused = azure.control("POST", "events/STARTED/cancel")
    unknown = azure.control("POST", "events/NOPE/cancel")
    # THEN the Scheduled one vanishes (Azure cancels by removal), the Started one stays (409)
    assert canceled.status_code == 200
    assert canceled.json()["result"] == "canceled"
    assert refused.status_code == 409
    assert "advance" in refused.json()["error"]
    assert unknown.status_code == 404
    after = azure.events()
    assert statuses(after) == [("STARTED", "Started")]
    assert after["DocumentIncarnation"] == before["DocumentIncarnation"] + 1


def test_advance_moves_an_event_one_step(azure: VmClient) -> None:
    # GIVEN a Scheduled event
    azure.add_event(event_type="Freeze", event_id="STEP")
    # WHEN it is advanced twice
    first = azure.post_ok("events/STEP/advance", {})
    in_between = azure.events()
    second = azure.post_ok("events/STEP/advance", {})
    # THEN Scheduled -> Started -> removed
    assert first["result"] == "started"
    assert statuses(in_between) == [("STEP", "Started")]
    assert second == {"result": "completed", "event": None}
    assert azure.events()["Events"] == []
    assert azure.state()["timeline"] == []


def test_hardware_failure_appears_already_started(azure: VmClient) -> None:
    # WHEN the host fails: a Reboot is added already Started
    azure.add_event(event_type="Reboot", event_id="HW", status="Started")
    document = azure.events()
    # THEN there was no Scheduled state and NotBefore is blank
    assert document["DocumentIncarnation"] == 2
    assert statuses(document) == [("HW", "Started")]
    assert document["Events"][0]["NotBefore"] == ""
    # THEN it completes 10 documented minutes later
    azure.advance(600)
    assert azure.events() == {"DocumentIncarnation": 3, "Events": []}


# --------------------------------------------------------------------------- one store, several VMs


def test_vms_share_one_event_store(start_sim: StartSim) -> None:
    # GIVEN two VMs of one availability set
    sim = start_sim(cloud="azure", vm_names=["web-0", "web-1"])
    web0, web1 = clients(sim)
    # WHEN an event for web-0 is added through web-0's port and web-1 approves it
    web0.add_event(event_type="Reboot", event_id="SHARED", resources=["web-0"])
    seen_by_1 = web1.events()
    assert web1.approve("SHARED").status_code == 200
    web1.advance(3)
    # THEN both VMs see the same EventId (broadcast), and web-1's approval started it for both
    assert statuses(seen_by_1) == [("SHARED", "Scheduled")]
    assert seen_by_1["Events"][0]["Resources"] == ["web-0"]
    assert statuses(web0.events()) == statuses(web1.events()) == [("SHARED", "Started")]
    assert sim.approvals()[0]["vm"] == "web-1"


def test_audience_limits_who_sees_an_event(start_sim: StartSim) -> None:
    # GIVEN an availability set of two VMs plus a Spot VM in one simulator
    sim = start_sim(cloud="azure", vm_names=["as-0", "as-1", "spot-0"])
    as0, as1, spot = clients(sim)
    # WHEN a Preempt is added for the Spot VM alone and a Freeze for the availability set
    spot.add_event(event_type="Preempt", event_id="EVICT", audience=["spot-0"])
    as0.add_event(event_type="Freeze", event_id="FREEZE", resources=["$0", "$1"], audience=["$0", "$1"])
    # THEN each VM sees only its own events, and incarnations count per VM
    assert statuses(spot.events()) == [("EVICT", "Scheduled")]
    assert statuses(as0.events()) == statuses(as1.events()) == [("FREEZE", "Scheduled")]
    assert spot.events()["DocumentIncarnation"] == 2
    assert as1.events()["Events"][0]["Resources"] == ["as-0", "as-1"]
    # WHEN a VM outside the audience approves the event it cannot see
    response = as0.approve("EVICT")
    as0.advance(3)
    # THEN, to that VM, it is an unknown EventId: 200, and the eviction is not approved
    assert response.status_code == 200
    assert statuses(spot.events()) == [("EVICT", "Scheduled")]
    assert [(a["vm"], a["outcome"]) for a in sim.approvals()] == [("as-0", "unknown-event")]


def test_resources_default_to_the_vm_whose_port_was_used(start_sim: StartSim) -> None:
    # GIVEN two VMs
    first, second = clients(start_sim(cloud="azure", vm_names=["a-0", "a-1"]))
    # WHEN an event without resources is added through the second VM's port
    event = second.add_event(event_type="Reboot")
    # THEN it concerns that VM, and gets a random uppercase GUID
    assert event["Resources"] == ["a-1"]
    assert event["EventId"] == event["EventId"].upper()
    assert len(event["EventId"]) == 36
    assert first.events()["Events"][0]["EventId"] == event["EventId"]
