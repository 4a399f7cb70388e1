"""Builders of model objects for tests: sensible defaults, override what matters."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from wire.model import Cloud, EventKind, EventSource, EventStatus, MaintenanceEvent

OBSERVED_AT = datetime(2022, 4, 11, 22, 11, 58, tzinfo=timezone.utc)


def azure_event(**overrides: Any) -> MaintenanceEvent:
    fields: dict[str, Any] = {
        "cloud": Cloud.AZURE,
        "event_id": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
        "kind": EventKind.FREEZE,
        "status": EventStatus.SCHEDULED,
        "reporter": "WestNO_0",
        "sequence": "2",
        "resources": ("WestNO_0", "WestNO_1"),
        "not_before": datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc),
        "duration_seconds": 5,
        "event_source": EventSource.PLATFORM,
        "description": "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
        "raw": {"EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123"},
    }
    fields.update(overrides)
    return MaintenanceEvent(**fields)
