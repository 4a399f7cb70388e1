"""Azure Resource Graph's `maintenanceresources` table over real HTTP: GET
/_sim/central/resource-graph holds one row per event, updated in place on each state change
(Scheduled, Started, Completed, Canceled), written by the same publication as the central feed,
and the functions read every row as a report of the simulator's VMs.

Time moves by clock advance, as in tests/contract/simulator/test_central_feed.py.
"""

from __future__ import annotations

from typing import Any

import requests

from functions.central.resource_graph import resource_graph_report
from simulator.azure_api import SIM_LOCATION, SIM_RESOURCE_GROUP, SIM_SUBSCRIPTION_ID
from tests.contract.simulator.conftest import TIMEOUT, VmClient
from tests.contract.simulator.test_central_feed import EVENT_ID, OTHER_ID, SIM_SCOPE, VMS, emitted, properties
from wire.model import EventStatus


def table(vm: VmClient) -> list[dict[str, Any]]:
    response = requests.get(f"{vm.base_url}/_sim/central/resource-graph", timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    assert answer["count"] == len(answer["data"])
    rows: list[dict[str, Any]] = answer["data"]
    return rows


def statuses(vm: VmClient) -> list[tuple[str, str]]:
    return [(row["name"], row["properties"]["EventStatus"]) for row in table(vm)]


def test_a_row_per_event_is_updated_in_place_on_each_state_change(azure: VmClient) -> None:
    # GIVEN an empty table
    assert table(azure) == []
    # WHEN a Freeze is scheduled, a Reboot is scheduled, and the Freeze starts and ends
    azure.add_event(event_type="Freeze", event_id=EVENT_ID)
    scheduled = table(azure)
    azure.add_event(event_type="Reboot", event_id=OTHER_ID)
    assert azure.approve(EVENT_ID).status_code == 200
    azure.advance(3)
    started = statuses(azure)
    azure.post_ok(f"events/{OTHER_ID}/cancel", {})
    azure.advance(600)
    # THEN each event has one row, in the order they were published, its status the latest
    assert started == [(EVENT_ID, "Started"), (OTHER_ID, "Scheduled")]
    assert statuses(azure) == [(EVENT_ID, "Completed"), (OTHER_ID, "Canceled")]
    # ... with the table's columns, and the properties the Event Grid event of the same change carries
    [row] = scheduled
    assert row == {
        "id": f"{VMS}/vm-0/providers/Microsoft.Maintenance/scheduledevents/{EVENT_ID}",
        "name": EVENT_ID,
        "type": "microsoft.maintenance/scheduledevents",
        "tenantId": row["tenantId"],
        "location": SIM_LOCATION,
        "resourceGroup": SIM_RESOURCE_GROUP,
        "subscriptionId": SIM_SUBSCRIPTION_ID,
        "properties": properties(emitted(azure)[0]),
        "zones": [],
    }
    assert [row["properties"] for row in table(azure)] == [properties(e) for e in emitted(azure)[-2:][::-1]]
    # ... and the functions read every row as a report of the simulator's VM
    for row in table(azure):
        report = resource_graph_report(row, SIM_SCOPE)
        assert (report.event_id, report.vms) == (row["name"], ("vm-0",))
        assert report.status is EventStatus(row["properties"]["EventStatus"].lower())


def test_what_the_feed_loses_while_central_off_the_table_misses_too(azure: VmClient) -> None:
    # GIVEN a scheduled Reboot in the table
    azure.add_event(event_type="Reboot", event_id=EVENT_ID)
    # WHEN the publication is off while it is canceled and another is scheduled, then on again
    azure.post_ok("faults", {"central_off": True})
    azure.post_ok(f"events/{EVENT_ID}/cancel", {})
    azure.add_event(event_type="Reboot", event_id=OTHER_ID)
    off = statuses(azure)
    azure.post_ok("faults", {"central_off": False})
    azure.post_ok(f"events/{OTHER_ID}/cancel", {})
    # THEN the table kept the last state it was told, and heard of the other event once back on
    assert off == [(EVENT_ID, "Scheduled")]
    assert statuses(azure) == [(EVENT_ID, "Scheduled"), (OTHER_ID, "Canceled")]


def test_delayed_and_duplicated_deliveries_do_not_touch_the_table(azure: VmClient) -> None:
    # GIVEN Event Grid's deliveries delayed a long while and every one sent twice
    azure.post_ok("faults", {"central_delay": 3600, "central_duplicates": 1})
    # WHEN a Reboot is scheduled
    azure.add_event(event_type="Reboot", event_id=EVENT_ID)
    # THEN the table has its one row at once, while Event Grid has delivered nothing yet
    assert statuses(azure) == [(EVENT_ID, "Scheduled")]
    assert emitted(azure) == []


def test_a_gce_simulator_has_no_resource_graph(gce: VmClient) -> None:
    response = requests.get(f"{gce.base_url}/_sim/central/resource-graph", timeout=TIMEOUT)
    assert response.status_code == 404
    assert "Azure Resource Graph's" in response.json()["error"]
