"""Event Grid's `ScheduledEventEmitted` events made into central reports (functions/central/event_grid.py).

The events are Microsoft's published examples (Azure/azure-rest-api-specs,
specification/eventgrid/data-plane/Microsoft.ResourceNotifications/stable/2018-01-01/examples/
{event-grid-schema,cloud-events-schema}/MaintenanceResources_ScheduledEventEmitted.json, commits
8cec4fb and c563439) with their placeholders filled in: subscription 0000...0001, resource group
prod-rg, scale set myvmss.
"""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from typing import Any

import pytest

from functions.central.event_grid import EVENT_TYPE, AzureScope, event_grid_report
from functions.core.central import EVENT_GRID
from wire.model import Cloud, EventKind, EventSource, EventStatus

SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"
EVENT_ID = "3da1b9aa-5204-4335-8c33-c54e315dcffe"
SCALE_SET = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/prod-rg/providers/Microsoft.Compute/virtualMachineScaleSets/myvmss"
)
DATA: dict[str, Any] = {
    "resourceInfo": {
        "id": f"{SCALE_SET}/providers/microsoft.maintenance/scheduledevents/{EVENT_ID}",
        "name": EVENT_ID,
        "type": "Microsoft.Maintenance/scheduledEvents",
        "location": "eastus",
        "properties": {
            "DurationInSeconds": 5,
            "Description": "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
            "EventId": EVENT_ID,
            "EventSource": "Platform",
            "EventStatus": "Started",
            "EventType": "Freeze",
            "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
            "Resources": ["myvmss_1", "myvmss_2"],
            "ResourceType": "VirtualMachine",
        },
    },
    "operationalInfo": {"resourceEventTime": "2017-06-26T18:41:00.9584103Z"},
    "apiVersion": "2023-07-01",
}
EVENT_GRID_SCHEMA: dict[str, Any] = {
    "id": EVENT_ID,
    "topic": f"/subscriptions/{SUBSCRIPTION}",
    "subject": SCALE_SET,
    "data": DATA,
    "eventType": EVENT_TYPE,
    "dataVersion": "3.0",
    "metadataVersion": "1",
    "eventTime": "2017-06-26T18:41:00.9584103Z",
}
CLOUD_EVENTS_SCHEMA: dict[str, Any] = {
    "id": EVENT_ID,
    "source": f"/subscriptions/{SUBSCRIPTION}",
    "subject": SCALE_SET,
    "data": DATA,
    "type": EVENT_TYPE,
    "specversion": "1.0",
    "time": "2017-06-26T18:41:00.9584103Z",
}
OURS = AzureScope(subscriptions=(SUBSCRIPTION,), resource_groups=("PROD-RG",))


@pytest.mark.parametrize("event", [EVENT_GRID_SCHEMA, CLOUD_EVENTS_SCHEMA], ids=["event-grid", "cloud-events"])
def test_the_documented_event_is_a_report_of_the_scale_sets_instances_by_their_full_identity(
    event: dict[str, Any],
) -> None:
    report = event_grid_report(event, OURS)

    assert (report.cloud, report.event_id, report.kind, report.status) == (
        Cloud.AZURE,
        EVENT_ID,
        EventKind.FREEZE,
        EventStatus.STARTED,
    )
    assert report.vms == ("myvmss_1", "myvmss_2")
    assert report.identity("myvmss_2") == (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/prod-rg/providers/Microsoft.Compute/virtualMachines/myvmss_2"
    )
    assert (report.source, report.notice_id) == (EVENT_GRID, EVENT_ID)
    assert report.not_before == datetime(2016, 9, 19, 18, 29, 47, tzinfo=timezone.utc)
    assert (report.duration_seconds, report.event_source) == (5, EventSource.PLATFORM)


@pytest.mark.parametrize("status", ["Completed", "Canceled"])
def test_the_ends_imds_never_shows_are_read(status: str) -> None:
    event = copy.deepcopy(EVENT_GRID_SCHEMA)
    event["data"]["resourceInfo"]["properties"].update(EventStatus=status, NotBefore="")

    report = event_grid_report(event, OURS)

    assert (report.status.value, report.not_before) == (status.lower(), None)


@pytest.mark.parametrize(
    ("scope", "why"),
    [
        (AzureScope(subscriptions=("00000000-0000-0000-0000-000000000002",)), "not in this deployment's scope"),
        (AzureScope(subscriptions=(SUBSCRIPTION,), resource_groups=("sandbox-rg",)), "not in this deployment's scope"),
    ],
    ids=["another subscription", "another resource group"],
)
def test_an_event_of_another_subscription_or_resource_group_is_refused_whatever_its_vms_are_named(
    scope: AzureScope, why: str
) -> None:
    with pytest.raises(match=why):
        event_grid_report(EVENT_GRID_SCHEMA, scope)


def _with(**properties: Any) -> dict[str, Any]:
    event = copy.deepcopy(EVENT_GRID_SCHEMA)
    event["data"]["resourceInfo"]["properties"].update(properties)
    return event


@pytest.mark.parametrize(
    ("event", "why"),
    [
        ({**EVENT_GRID_SCHEMA, "eventType": "Microsoft.Resources.ResourceWriteSuccess"}, "not a scheduled event"),
        ({**EVENT_GRID_SCHEMA, "data": "text"}, "data must be an object"),
        (_with(Resources=[]), "Resources must be a list"),
        (_with(Resources=["web\n0"]), r"Resources\[0\] must not contain control characters"),
        (_with(Resources=["vm"] * 1001), "at most 1000"),
        (_with(EventStatus="Paused"), "EventStatus 'paused'"),
        (_with(EventId=""), "EventId must be a non-empty string"),
        (_with(NotBefore="tomorrow"), "NotBefore"),
        (_with(DurationInSeconds="5"), "DurationInSeconds must be a whole number"),
    ],
    ids=[
        "another type",
        "no data",
        "no VMs",
        "a name no command carries",
        "too many VMs",
        "an unknown status",
        "no event id",
        "a garbled NotBefore",
        "a duration as text",
    ],
)
def test_what_cannot_be_read_is_refused_with_the_field_named(event: dict[str, Any], why: str) -> None:
    with pytest.raises(match=why):
        event_grid_report(event, OURS)


def test_a_resource_that_is_not_a_vm_scale_set_or_availability_set_is_refused() -> None:
    event = copy.deepcopy(EVENT_GRID_SCHEMA)
    event["data"]["resourceInfo"]["id"] = (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/prod-rg/providers/Microsoft.Storage/storageAccounts/x"
    )

    with pytest.raises(match="is not a VM, scale set or availability set"):
        event_grid_report(event, OURS)


def test_an_unknown_event_type_is_kept_as_unknown() -> None:
    assert event_grid_report(_with(EventType="Hibernate"), OURS).kind is EventKind.UNKNOWN
