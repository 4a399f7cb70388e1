"""Azure's central feed over real HTTP: GET /_sim/central/events publishes an Event Grid
`ScheduledEventEmitted` event for every state change of the simulator's events, including the
Completed and Canceled that IMDS never shows, and the functions read every one of them.

Time moves by clock advance, as in the lifecycle tests; the one real wait (a delayed delivery) polls
with a deadline and asserts only what holds however fast the machine is.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from typing import Any

import pytest
import requests

from functions.central.event_grid import AzureScope, event_grid_report
from simulator.azure_api import SIM_LOCATION, SIM_RESOURCE_GROUP, SIM_SUBSCRIPTION_ID
from simulator.scenarios import LIVE_MIGRATION_EVENT_ID
from tests.contract.simulator.conftest import TIMEOUT, StartSim, VmClient, clients
from tests.unit.azure.test_central_events import EVENT_GRID_SCHEMA
from wire.model import EventStatus

SIM_SCOPE = AzureScope(subscriptions=(SIM_SUBSCRIPTION_ID,), resource_groups=(SIM_RESOURCE_GROUP,))
VMS = (
    f"/subscriptions/{SIM_SUBSCRIPTION_ID}/resourceGroups/{SIM_RESOURCE_GROUP}"
    "/providers/Microsoft.Compute/virtualMachines"
)
EVENT_ID = "5E2D9C41-7A3B-4F10-9C6E-2B8D4A1F0C37"
OTHER_ID = "0F7A6B2C-3D4E-4F50-8A9B-C0D1E2F30415"
EVENT_GRID_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{7}Z")


def central(vm: VmClient, **params: str | int) -> requests.Response:
    return requests.get(f"{vm.base_url}/_sim/central/events", params=params, timeout=TIMEOUT)


def feed(vm: VmClient, **params: str | int) -> dict[str, Any]:
    response = central(vm, **params)
    assert response.status_code == 200, response.text
    page: dict[str, Any] = response.json()
    return page


def emitted(vm: VmClient) -> list[dict[str, Any]]:
    """Every event delivered so far, in seq order."""
    entries = feed(vm, limit=1000)["events"]
    assert [entry["seq"] for entry in entries] == list(range(1, len(entries) + 1))
    return [entry["event"] for entry in entries]


def properties(event: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = event["data"]["resourceInfo"]["properties"]
    return props


def lifecycle(vm: VmClient) -> list[tuple[str, str]]:
    return [(properties(e)["EventId"], properties(e)["EventStatus"]) for e in emitted(vm)]


def shape(value: object) -> object:
    """The keys of a JSON value at every level, without the values."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    return type(value).__name__ if not isinstance(value, list) else "list"


def assert_read_by_the_functions(event: dict[str, Any]) -> None:
    """The Azure function app takes the event as a report of the simulator's VMs, in its status."""
    report = event_grid_report(event, SIM_SCOPE)
    props = properties(event)
    assert report.event_id == props["EventId"]
    assert report.status is EventStatus(props["EventStatus"].lower())
    assert report.vms == tuple(props["Resources"])
    assert report.notice_id == event["id"]
    assert [report.identity(vm) for vm in report.vms] == [f"{VMS}/{vm}" for vm in props["Resources"]]


# --------------------------------------------------------------------------- what is emitted


def test_a_scheduled_event_is_emitted_as_scheduled_with_the_imds_values_and_an_rfc1123_not_before(
    azure: VmClient,
) -> None:
    # GIVEN an empty feed
    assert feed(azure) == {"events": [], "next": 0}
    # WHEN a Reboot is scheduled
    azure.add_event(event_type="Reboot", event_id=EVENT_ID, event_source="User", duration_seconds=30)
    shown = azure.events()["Events"][0]
    # THEN one Event Grid event carries it, with exactly the fields of Microsoft's example
    page = feed(azure)
    assert page["next"] == 1
    [entry] = page["events"]
    assert entry["seq"] == 1
    event = entry["event"]
    assert shape(event) == shape(EVENT_GRID_SCHEMA)
    assert list(event) == list(EVENT_GRID_SCHEMA)
    assert list(properties(event)) == list(properties(EVENT_GRID_SCHEMA))
    subject = f"{VMS}/vm-0"
    assert {key: event[key] for key in ("topic", "subject", "eventType", "dataVersion", "metadataVersion")} == {
        "topic": f"/subscriptions/{SIM_SUBSCRIPTION_ID}",
        "subject": subject,
        "eventType": "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted",
        "dataVersion": "3.0",
        "metadataVersion": "1",
    }
    info = event["data"]["resourceInfo"]
    assert (info["id"], info["name"], info["type"], info["location"]) == (
        f"{subject}/providers/Microsoft.Maintenance/scheduledevents/{EVENT_ID}",
        EVENT_ID,
        "Microsoft.Maintenance/scheduledEvents",
        SIM_LOCATION,
    )
    # the values the VM's own document shows, NotBefore in RFC 1123 included
    assert properties(event) == {key: shown[key] for key in properties(event)}
    assert re.fullmatch(r"[A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT", properties(event)["NotBefore"])
    assert event["eventTime"] == event["data"]["operationalInfo"]["resourceEventTime"]
    assert EVENT_GRID_TIME.fullmatch(event["eventTime"])
    assert abs(datetime.fromisoformat(event["eventTime"][:26] + "+00:00").timestamp() - time.time()) < 60
    assert_read_by_the_functions(event)


def test_approval_then_time_emit_started_then_completed(azure: VmClient) -> None:
    # GIVEN a scheduled Freeze
    azure.add_event(event_type="Freeze", event_id=EVENT_ID)
    # WHEN the VM approves it, and documented time passes to its start and its end
    assert azure.approve(EVENT_ID).status_code == 200
    after_approval = lifecycle(azure)
    azure.advance(3)
    azure.advance(600)
    # THEN the approval itself emits nothing; the start and the removal do, as Started and Completed
    assert after_approval == [(EVENT_ID, "Scheduled")]
    assert lifecycle(azure) == [(EVENT_ID, "Scheduled"), (EVENT_ID, "Started"), (EVENT_ID, "Completed")]
    events = emitted(azure)
    assert [properties(e)["NotBefore"] for e in events[1:]] == ["", ""]
    assert len({e["id"] for e in events}) == 3  # a fresh id per emission
    times = [e["eventTime"] for e in events]
    assert times == sorted(times)
    for event in events:
        assert_read_by_the_functions(event)


def test_the_documented_live_migration_is_emitted_scheduled_started_completed(start_sim: StartSim) -> None:
    # GIVEN the docs' live-migration example on its two VMs
    west0, _ = clients(start_sim(scenario="azure-live-migration"))
    # WHEN documented time passes to the event (60 s), its NotBefore (15 min) and its end (10 min)
    for seconds in (60, 900, 600):
        west0.advance(seconds)
    # THEN the feed told each state change once, naming both VMs, and the functions read each
    assert lifecycle(west0) == [
        (LIVE_MIGRATION_EVENT_ID, "Scheduled"),
        (LIVE_MIGRATION_EVENT_ID, "Started"),
        (LIVE_MIGRATION_EVENT_ID, "Completed"),
    ]
    for event in emitted(west0):
        assert properties(event)["Resources"] == ["WestNO_0", "WestNO_1"]
        assert properties(event)["DurationInSeconds"] == 5
        assert_read_by_the_functions(event)


def test_a_canceled_event_is_emitted_as_canceled(azure: VmClient) -> None:
    # GIVEN a scheduled Redeploy
    azure.add_event(event_type="Redeploy", event_id=EVENT_ID)
    # WHEN it is canceled (IMDS just drops it)
    azure.post_ok(f"events/{EVENT_ID}/cancel", {})
    # THEN the feed says Canceled, with a blank NotBefore, and the functions read it as canceled
    assert azure.events()["Events"] == []
    assert lifecycle(azure) == [(EVENT_ID, "Scheduled"), (EVENT_ID, "Canceled")]
    canceled = emitted(azure)[-1]
    assert properties(canceled)["NotBefore"] == ""
    assert_read_by_the_functions(canceled)


def test_an_event_created_started_is_first_emitted_as_started(azure: VmClient) -> None:
    # WHEN a hardware failure appears (already Started, no notice) and ends
    azure.add_event(event_type="Reboot", event_id=EVENT_ID, status="Started")
    azure.advance(600)
    # THEN the feed never says Scheduled
    assert lifecycle(azure) == [(EVENT_ID, "Started"), (EVENT_ID, "Completed")]


def test_a_multi_vm_event_names_every_vm_and_is_raised_on_the_first(start_sim: StartSim) -> None:
    # GIVEN three VMs on one host
    vm = clients(start_sim(cloud="azure", vm_names=["host-a", "host-b", "host-c"]))[0]
    # WHEN one Reboot names them all
    vm.add_event(event_type="Reboot", event_id=EVENT_ID, resources=["$0", "$1", "$2"])
    # THEN its emission lists all three, is raised on the first, and reports all three
    [event] = emitted(vm)
    assert properties(event)["Resources"] == ["host-a", "host-b", "host-c"]
    assert event["subject"] == f"{VMS}/host-a"
    assert event["data"]["resourceInfo"]["id"].startswith(f"{VMS}/host-a/providers/")
    assert event_grid_report(event, SIM_SCOPE).vms == ("host-a", "host-b", "host-c")
    assert_read_by_the_functions(event)


# --------------------------------------------------------------------------- paging


def test_pages_follow_after_and_limit(azure: VmClient) -> None:
    # GIVEN five emissions: two events scheduled and canceled, one scheduled
    for event_id in (EVENT_ID, OTHER_ID):
        azure.add_event(event_type="Reboot", event_id=event_id)
        azure.post_ok(f"events/{event_id}/cancel", {})
    azure.add_event(event_type="Reboot", event_id="LAST")
    # WHEN they are read two at a time
    pages = [feed(azure, after=after, limit=2) for after in (0, 2, 4, 5, 9)]
    # THEN each page holds what follows `after`, and `next` is where to go on from
    assert [[entry["seq"] for entry in page["events"]] for page in pages] == [[1, 2], [3, 4], [5], [], []]
    assert [page["next"] for page in pages] == [2, 4, 5, 5, 9]
    assert feed(azure)["next"] == 5  # limit defaults to 100
    assert [entry["event"] for entry in feed(azure, after=2, limit=1)["events"]] == emitted(azure)[2:3]


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"after": -1}, "after"),
        ({"after": "x"}, "after"),
        ({"after": "1.5"}, "after"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": ""}, "limit"),
    ],
)
def test_bad_paging_parameters_are_400_naming_the_parameter(
    azure: VmClient, params: dict[str, str | int], name: str
) -> None:
    response = central(azure, **params)
    assert response.status_code == 400
    assert f"parameter '{name}'" in response.json()["error"]


# --------------------------------------------------------------------------- faults


def test_duplicates_repeat_the_whole_event_with_the_same_id(azure: VmClient) -> None:
    # GIVEN every second emission delivered twice
    azure.post_ok("faults", {"central_duplicates": 2})
    # WHEN four emissions are made
    for event_id in (EVENT_ID, OTHER_ID):
        azure.add_event(event_type="Reboot", event_id=event_id)
        azure.post_ok(f"events/{event_id}/cancel", {})
    # THEN the second and the fourth come twice, byte for byte, under one id
    raw = central(azure).text
    events = emitted(azure)
    assert [(props["EventId"], props["EventStatus"]) for props in map(properties, events)] == [
        (EVENT_ID, "Scheduled"),
        (EVENT_ID, "Canceled"),
        (EVENT_ID, "Canceled"),
        (OTHER_ID, "Scheduled"),
        (OTHER_ID, "Canceled"),
        (OTHER_ID, "Canceled"),
    ]
    for first, second in ((1, 2), (4, 5)):
        assert events[first]["id"] == events[second]["id"]
        assert json.dumps(events[first]) == json.dumps(events[second])
        assert raw.count(json.dumps(events[first])) == 2
    assert len({e["id"] for e in events}) == 4
    assert azure.state()["central"]["faults"]["central_duplicates"] == 2


def test_central_off_loses_the_emissions_made_while_it_is_on(azure: VmClient) -> None:
    # GIVEN the feed switched off
    azure.post_ok("faults", {"central_off": True})
    # WHEN an event is scheduled, the feed comes back, and the event is canceled
    azure.add_event(event_type="Reboot", event_id=EVENT_ID)
    off = feed(azure)
    azure.post_ok("faults", {"central_off": False})
    azure.post_ok(f"events/{EVENT_ID}/cancel", {})
    # THEN only the cancel was emitted; the log says what was lost
    assert off == {"events": [], "next": 0}
    assert lifecycle(azure) == [(EVENT_ID, "Canceled")]
    assert any("lost (central_off)" in entry["message"] for entry in azure.get_list("log"))


def test_central_delay_holds_an_emission_back(azure: VmClient) -> None:
    # GIVEN emissions held back an hour
    azure.post_ok("faults", {"central_delay": 3600})
    # WHEN an event is scheduled
    azure.add_event(event_type="Reboot", event_id=EVENT_ID)
    # THEN it is not readable yet: no seq is spent on it
    assert feed(azure) == {"events": [], "next": 0}
    assert azure.state()["central"]["pending"] == 1
    # WHEN the delay goes back to 0 and another event is scheduled
    azure.post_ok("faults", {"central_delay": 0})
    azure.add_event(event_type="Freeze", event_id=OTHER_ID)
    # THEN that one is readable at once, as seq 1; the first still waits out its hour
    assert lifecycle(azure) == [(OTHER_ID, "Scheduled")]


def test_a_delayed_emission_arrives_no_sooner_than_its_delay(azure: VmClient) -> None:
    # GIVEN a short delay
    azure.post_ok("faults", {"central_delay": 0.3})
    # WHEN an event is scheduled and the feed polled until it shows
    before = time.monotonic()
    azure.add_event(event_type="Reboot", event_id=EVENT_ID)
    deadline = before + 10
    while not feed(azure)["events"]:
        assert time.monotonic() < deadline, "the delayed emission never arrived"
        time.sleep(0.02)
    # THEN it came, and not before its delay
    assert time.monotonic() - before >= 0.3
    assert lifecycle(azure) == [(EVENT_ID, "Scheduled")]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"central_delay": -1}, "central_delay"),
        ({"central_delay": "soon"}, "central_delay"),
        ({"central_delay": True}, "central_delay"),
        ({"central_duplicates": -1}, "central_duplicates"),
        ({"central_duplicates": 1.5}, "central_duplicates"),
        ({"central_off": "yes"}, "central_off"),
        ({"vm": "$0", "central_off": True}, "vm"),
    ],
)
def test_central_fault_fields_are_validated(azure: VmClient, body: dict[str, object], field: str) -> None:
    response = azure.control("POST", "faults", body)
    assert response.status_code == 400
    assert f"field '{field}'" in response.json()["error"]
    assert azure.state()["central"]["faults"] == {"central_delay": 0.0, "central_duplicates": 0, "central_off": False}
