"""Azure Resource Graph's `maintenanceresources` rows: made into central reports
(functions/central/resource_graph.py), and read page by page with azure-mgmt-resourcegraph
(functions/azure_app/resource_graph.py).

The row is the table's columns (Microsoft's "Scheduled Events in Azure Resource Graph" page) around
the properties of Microsoft's published Event Grid example (tests/unit/azure/test_central_events.py):
the page says the table holds "the same information as would be available in Event Grid". The
client is an in-memory stand-in answering with the SDK's own `QueryResponse`, and keeping the
SDK's `QueryRequest`s it was given.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError
from azure.mgmt.resourcegraph.models import QueryRequest, QueryRequestOptions, QueryResponse

from functions.azure_app.resource_graph import (
    PAGE,
    ResourceGraphConfigError,
    ResourceGraphUnavailableError,
    SdkResourceGraphRows,
    scheduled_events_query,
)
from functions.central.event_grid import AzureScope
from functions.central.resource_graph import resource_graph_report
from functions.core.central import RESOURCE_GRAPH
from tests.unit.azure.test_central_events import DATA, EVENT_ID, OURS, SCALE_SET, SUBSCRIPTION
from wire.model import EventKind, EventStatus

ROW: dict[str, Any] = {
    "id": f"{SCALE_SET}/providers/Microsoft.Maintenance/scheduledevents/{EVENT_ID}",
    "name": EVENT_ID,
    "type": "microsoft.maintenance/scheduledevents",
    "tenantId": "00000000-0000-0000-0000-00000000000a",
    "location": "eastus",
    "resourceGroup": "prod-rg",
    "subscriptionId": SUBSCRIPTION,
    "properties": copy.deepcopy(DATA["resourceInfo"]["properties"]),
    "zones": ["1"],
}


def _with(**columns: Any) -> dict[str, Any]:
    return {**copy.deepcopy(ROW), **columns}


def _properties(**properties: Any) -> dict[str, Any]:
    changed = copy.deepcopy(ROW)
    changed["properties"].update(properties)
    return changed


def test_a_row_is_the_report_its_event_grid_event_is() -> None:
    report = resource_graph_report(ROW, OURS)

    assert (report.event_id, report.kind, report.status) == (EVENT_ID, EventKind.FREEZE, EventStatus.STARTED)
    assert report.vms == ("myvmss_1", "myvmss_2")
    assert report.identity("myvmss_1") == (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/prod-rg/providers/Microsoft.Compute/virtualMachines/myvmss_1"
    )
    assert (report.source, report.notice_id) == (RESOURCE_GRAPH, ROW["id"])


@pytest.mark.parametrize("status", ["Completed", "Canceled"])
def test_the_ends_the_table_keeps_are_read(status: str) -> None:
    assert resource_graph_report(_properties(EventStatus=status, NotBefore=""), OURS).status.value == status.lower()


@pytest.mark.parametrize(
    ("row", "why"),
    [
        (_with(type="microsoft.maintenance/applyupdates"), "not a scheduled event"),
        (_with(type=["microsoft.maintenance/scheduledevents"]), "not a scheduled event"),
        (_with(properties="{}"), "properties must be an object"),
        (_with(id=7), "id must be a non-empty string"),
        (_with(id="/subscriptions/" + "x" * 600), "an ARM id is at most 512"),
        (_properties(Resources=["vm"] * 100_000), "at most 1000"),
        (_properties(Resources="web-0"), "Resources must be a list"),
        (_properties(EventStatus="Paused"), "EventStatus 'paused'"),
        (_properties(EventId="3da1b9aa-0000-0000-0000-000000000000"), "is not the scheduled event"),
        (_with(subscriptionId="00000000-0000-0000-0000-000000000002"), "column subscriptionId"),
        (_with(resourceGroup="sandbox-rg"), "column resourceGroup"),
        (_with(name="another"), "column name"),
        (_with(id=ROW["id"].replace("prod-rg", "sandbox-rg"), resourceGroup="sandbox-rg"), "not in this deployment"),
        (_with(id=ROW["id"].replace("virtualMachineScaleSets", "storageAccounts")), "not a VM, scale set"),
    ],
    ids=[
        "another type",
        "a type that is no string",
        "properties as text",
        "an id that is no string",
        "a huge id",
        "a huge Resources",
        "Resources as text",
        "an unknown status",
        "an id of another event",
        "a subscription column the id does not say",
        "a resource group column the id does not say",
        "a name that is not the EventId",
        "another resource group",
        "a resource that is no VM",
    ],
)
def test_a_row_that_cannot_be_read_or_is_not_ours_is_refused_saying_why(row: dict[str, Any], why: str) -> None:
    with pytest.raises(match=why):
        resource_graph_report(row, OURS)


# --------------------------------------------------------------------------- read with the SDK


@dataclass
class Client:
    """A ResourceGraphClient's `resources`, answering from a table of rows in pages of `PAGE`."""

    table: list[dict[str, Any]]
    requests: list[QueryRequest] = field(default_factory=list)
    error: Exception | None = None

    def resources(self, query: QueryRequest) -> QueryResponse:
        self.requests.append(query)
        if self.error is not None:
            raise self.error
        start = int(options(query).skip_token or 0)
        page = self.table[start : start + (options(query).top or PAGE)]
        following = start + len(page)
        return QueryResponse(
            total_records=len(self.table),
            count=len(page),
            result_truncated="false",
            data=cast(Any, page),  # objectArray: a list of rows (the SDK annotates `data` as an object)
            skip_token=str(following) if following < len(self.table) else None,
        )


def options(request: QueryRequest) -> QueryRequestOptions:
    assert request.options is not None
    return request.options


def rows(count: int) -> list[dict[str, Any]]:
    return [_with(id=f"{ROW['id']}-{index}") for index in range(count)]


SCOPE = AzureScope(subscriptions=(SUBSCRIPTION,), resource_groups=("prod-rg", "web(1)"))


def test_the_rows_are_read_in_pages_with_the_skip_token_over_the_trusted_subscriptions() -> None:
    client = Client(rows(2500))

    read = list(SdkResourceGraphRows(client).rows(SCOPE, 5000))

    assert len(read) == 2500
    assert [(options(r).skip_token, options(r).top) for r in client.requests] == [
        (None, 1000),
        ("1000", 1000),
        ("2000", 1000),
    ]
    assert {tuple(r.subscriptions or ()) for r in client.requests} == {(SUBSCRIPTION,)}
    assert {options(r).result_format for r in client.requests} == {"objectArray"}
    assert {r.query for r in client.requests} == {scheduled_events_query(SCOPE)}


def test_a_pass_stops_at_its_bound_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    client = Client(rows(2500))

    with caplog.at_level(logging.WARNING, logger="mbridge.functions.azure.resource_graph"):
        read = list(SdkResourceGraphRows(client).rows(SCOPE, 1500))

    assert len(read) == 1500
    assert [options(r).top for r in client.requests] == [1000, 500]
    assert "stopped after 1500 rows" in caplog.text


def test_the_query_asks_for_the_scheduled_events_of_the_trusted_groups_in_a_stable_order() -> None:
    query = scheduled_events_query(SCOPE)

    assert query.splitlines() == [
        "maintenanceresources",
        '| where type =~ "microsoft.maintenance/scheduledevents"',
        '| where tostring(properties.EventStatus) in~ ("Scheduled", "Started", "Completed", "Canceled")',
        '| where resourceGroup in~ ("prod-rg", "web(1)")',
        "| project id, name, type, tenantId, location, resourceGroup, subscriptionId, properties, zones",
        "| order by id asc",
    ]
    assert "where resourceGroup" not in scheduled_events_query(AzureScope(subscriptions=(SUBSCRIPTION,)))
    with pytest.raises(ValueError, match="not a resource group name"):
        scheduled_events_query(AzureScope(subscriptions=(SUBSCRIPTION,), resource_groups=('rg" or 1==1 //',)))


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (ClientAuthenticationError("no token"), ResourceGraphConfigError),
        (HttpResponseError("forbidden", response=None), ResourceGraphUnavailableError),
    ],
    ids=["no token", "an error without a status"],
)
def test_errors_are_permanent_for_the_identity_and_retryable_otherwise(
    error: Exception, raised: type[Exception]
) -> None:
    with pytest.raises(raised):
        list(SdkResourceGraphRows(Client([], error=error)).rows(SCOPE, 10))


def test_a_refused_identity_names_the_role() -> None:
    error = HttpResponseError("forbidden")
    error.status_code = 403
    with pytest.raises(ResourceGraphConfigError, match="give it Reader"):
        list(SdkResourceGraphRows(Client([], error=error)).rows(SCOPE, 10))
