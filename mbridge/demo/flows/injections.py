"""The control-API calls that start a flow's maintenance in the simulator: an Azure event, or a value
of GCE's maintenance-event or upcoming-maintenance.
"""

from __future__ import annotations

from typing import Any

from mbridge.demo.flows.model import GCE_VM, STARTED_FOR


def azure_event(
    event_type: str, event_id: str, resources: tuple[str, ...], **fields: Any
) -> tuple[str, dict[str, Any]]:
    body = {"event_type": event_type, "event_id": event_id, "resources": list(resources), "started_for": STARTED_FOR}
    return "/_sim/events", {**body, **fields}


def gce_value(value: str) -> tuple[str, dict[str, Any]]:
    return "/_sim/gce", {"vm": GCE_VM, "key": "maintenance-event", "value": value}


def gce_upcoming(value: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """Set (or, with None, remove) GCE's upcoming-maintenance on the demo's GCE VM."""
    return "/_sim/gce", {"vm": GCE_VM, "key": "upcoming-maintenance", "value": value}
