"""Azure Resource Graph's `maintenanceresources` table, as the simulator keeps it: one row per
scheduled event, written when the event is first published and updated in place on each state
change (Scheduled, Started, Completed, Canceled), read whole with GET /_sim/central/resource-graph.

Microsoft's "Scheduled Events in Azure Resource Graph" page: scheduled events "are written to the
`maintenanceresources` table with type `microsoft.maintenance/scheduledevents`. Every time a
scheduled event changes state it ... update[s] its entry in the table with the same information as
would be available in Event Grid". Its columns: `id` (the scheduled event's ARM id), `name` (the
EventId), `type`, `tenantId`, `location`, `resourceGroup`, `subscriptionId`, `properties` and
`zones`. One switch publishes to Event Grid and the table, so the central feed writes both
(central_feed.py), and what the feed loses while `central_off` the table misses too.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping

ROW_TYPE = "microsoft.maintenance/scheduledevents"
SIM_TENANT_ID = str(uuid.uuid5(uuid.NAMESPACE_URL, "maintenance-bridge-sim/tenant"))


class ResourceGraphTable:
    """The rows by EventId, in the order the events were first published; guarded by `cond`."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond
        self._rows: dict[str, Mapping[str, object]] = {}

    def write(
        self,
        resource_id: str,
        event_id: str,
        properties: Mapping[str, object],
        *,
        subscription_id: str,
        resource_group: str,
        location: str,
    ) -> None:
        """Write the event's row: added the first time, replaced in its place after."""
        with self._cond:
            self._rows[event_id] = {
                "id": resource_id,
                "name": event_id,
                "type": ROW_TYPE,
                "tenantId": SIM_TENANT_ID,
                "location": location,
                "resourceGroup": resource_group,
                "subscriptionId": subscription_id,
                "properties": dict(properties),
                "zones": [],
            }

    def rows(self) -> list[Mapping[str, object]]:
        with self._cond:
            return list(self._rows.values())
