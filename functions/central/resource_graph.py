"""Azure Scheduled Events from the control plane, read back: the rows of Azure Resource Graph's
`maintenanceresources` table made into `CentralReport`s, and the reconciliation that acts on every
row of the deployment's scope on each pass (docs/azure.md#the-control-planes-reports).

The table (Microsoft's "Scheduled Events in Azure Resource Graph" page): one row per scheduled event,
of type `microsoft.maintenance/scheduledevents`, updated in place "every time a scheduled event
changes state" with the same fields as Event Grid's event, `Completed` and `Canceled` included. Its
columns are `id` (the ARM id of the scheduled event: the VM, scale set or availability set it was
raised on, then `/providers/Microsoft.Maintenance/scheduledevents/<EventId>`), `name` (the EventId),
`type`, `tenantId`, `location`, `resourceGroup`, `subscriptionId`, `properties` (the fields Event Grid
carries in `data.resourceInfo.properties`, read by the same function, `scheduled_event_report`) and
`zones`.

Why read it when Event Grid pushes the same: a delivery Event Grid dropped (its retries run out, the
queue was full or disabled) and an event that began before this deployment subscribed are in the
table; the reconciliation finds them within one pass. Each row is read again on every pass: the
claim per feed (`central|resource-graph`) makes a step act once, and its repeats are quiet
(`process_central(..., quiet_repeats=True)`) so the audit log is not filled with them. A step
Event Grid or the agent already brought still goes through once from here, and does nothing twice:
the event's steps merge by its id and its end is recorded once (functions/core/central.py).

The rows come through the port `ResourceGraphRows`; the Azure app's implementation queries Resource
Graph with azure-mgmt-resourcegraph (functions/azure_app/resource_graph.py), a test's is a list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from functions.central.event_grid import AzureScope, json_object, json_text, scheduled_event_report
from functions.central.polling import poll_pass
from functions.core.central import RESOURCE_GRAPH, CentralRefused, CentralReport
from functions.core.process import Deps, Outcome

ROW_TYPE = "microsoft.maintenance/scheduledevents"
_SCHEDULED_EVENT = "/providers/microsoft.maintenance/scheduledevents/"
# A scheduled event's id: a subscription (36), a resource group (at most 90), a VM or scale set
# name (at most 64), an EventId and the fixed segments come to far less.
MAX_ID = 512
# Rows one pass reads at most: five of Resource Graph's pages of 1,000. Past it the rest of the
# table waits, and the reader logs that it stopped (docs/azure.md).
ROWS_MOST = 5000
# The statuses a row is read in: the four Microsoft documents for Event Grid and Resource Graph.
STATUSES = ("Scheduled", "Started", "Completed", "Canceled")


class ResourceGraphRows(Protocol):
    """The `maintenanceresources` rows of scheduled events in the scope's subscriptions (and, when
    it names them, resource groups), in a stable order, read in pages; at most `most` of them."""

    def rows(self, scope: AzureScope, most: int) -> Iterable[Mapping[str, Any]]: ...


def resource_graph_report(row: Mapping[str, Any], scope: AzureScope) -> CentralReport:
    """The report of one `maintenanceresources` row of the VMs in `scope`.

    Raises:
        CentralRefused: another type of row, a column that cannot be read or contradicts the row's
            id, or a resource outside the deployment's scope.
    """
    kind = row.get("type")
    if not isinstance(kind, str) or kind.lower() != ROW_TYPE:
        raise CentralRefused(f"row type {str(kind)[:120]!r} is not {ROW_TYPE}: not a scheduled event")
    resource_id = json_text(row.get("id"), "id")
    if len(resource_id) > MAX_ID:
        raise CentralRefused(f"id is {len(resource_id)} characters long; an ARM id is at most {MAX_ID}")
    properties = json_object(row.get("properties"), "properties")
    event_id = json_text(properties.get("EventId"), "EventId")
    if not resource_id.lower().endswith(_SCHEDULED_EVENT + event_id.lower()):
        raise CentralRefused(f"id {resource_id[:200]!r} is not the scheduled event {event_id[:64]!r} (its EventId)")
    report = scheduled_event_report(resource_id, properties, scope, source=RESOURCE_GRAPH, notice_id=resource_id)
    # The columns repeat what the id says; a row whose columns say otherwise is not the table's.
    subscription, group = resource_id.split("/")[2], resource_id.split("/")[4]
    for column, expected in (("subscriptionId", subscription), ("resourceGroup", group), ("name", event_id)):
        value = row.get(column)
        if value is not None and (not isinstance(value, str) or value.lower() != expected.lower()):
            raise CentralRefused(f"column {column} {str(value)[:90]!r} is not the id's {expected[:90]!r}")
    return report


def reconcile(rows_source: ResourceGraphRows, deps: Deps, scope: AzureScope, now: datetime) -> list[Outcome]:
    """One pass over the table: every row of the scope acted on through `process_central`, repeats
    of steps already taken from this feed quietly (functions/central/polling.py).

    Raises:
        RetryableError: a transient failure reading the table or acting on a row: the pass stops,
            and the next one (the timer's) reads the table again.
    """
    rows = rows_source.rows(scope, ROWS_MOST)
    return poll_pass(rows, lambda row: resource_graph_report(row, scope), deps, now, "resource graph reconciliation")
