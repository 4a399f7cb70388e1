"""The golden envelopes: built from the recorded metadata documents.

tests/unit/test_envelope.py holds the code to the files in fixtures/envelopes/;
scripts/regenerate_golden_envelopes.py rewrites them after an intended change.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from agent.sources.azure.document import parse_scheduled_events, to_maintenance_event
from agent.sources.gce.values import (
    MaintenanceValue,
    maintenance_event,
    parse_upcoming_maintenance,
    upcoming_event,
)
from tests.fixtures import FIXTURES
from wire.envelope import envelope_for_event, to_cloudevent
from wire.model import EventStatus

OBSERVED = datetime(2022, 4, 11, 22, 11, 58, tzinfo=timezone.utc)


def golden_envelopes() -> dict[str, dict[str, Any]]:
    """Name → structured CloudEvent, built from the recorded documents."""
    azure = FIXTURES / "azure"
    scheduled_doc = parse_scheduled_events((azure / "live-migration-2.json").read_text())
    started_doc = parse_scheduled_events((azure / "live-migration-3.json").read_text())
    terminate_doc = parse_scheduled_events((azure / "vmss-terminate.json").read_text())
    upcoming = parse_upcoming_maintenance((FIXTURES / "gce" / "upcoming-maintenance.json").read_text())
    later = timedelta(minutes=15)
    events = {
        "azure-live-migration-scheduled": (
            to_maintenance_event(
                scheduled_doc.events[0], status=EventStatus.SCHEDULED, reporter="WestNO_0", sequence="2"
            ),
            OBSERVED,
        ),
        "azure-live-migration-started": (
            to_maintenance_event(started_doc.events[0], status=EventStatus.STARTED, reporter="WestNO_0", sequence="3"),
            OBSERVED + later,
        ),
        "azure-live-migration-completed": (
            to_maintenance_event(
                started_doc.events[0], status=EventStatus.COMPLETED, reporter="WestNO_0", sequence="4"
            ),
            OBSERVED + later + timedelta(minutes=10),
        ),
        "azure-vmss-terminate-scheduled": (
            to_maintenance_event(
                terminate_doc.events[0], status=EventStatus.SCHEDULED, reporter="myScaleSet_2", sequence="7"
            ),
            OBSERVED,
        ),
        "gce-live-migrate-scheduled": (
            maintenance_event(
                value=MaintenanceValue.MIGRATE_ON_HOST_MAINTENANCE,
                status=EventStatus.SCHEDULED,
                instance_id="4113390128391523715",
                reporter="gce-vm-0",
                first_observed=OBSERVED,
                sequence="6ef2aa8bd6c1a8f3",
            ),
            OBSERVED,
        ),
        "gce-upcoming-scheduled": (
            upcoming_event(
                upcoming=upcoming,
                status=EventStatus.SCHEDULED,
                instance_id="4113390128391523715",
                reporter="c3-vm-0",
                first_observed=OBSERVED,
                sequence="0b3a1f7e5c2d9a64",
            ),
            OBSERVED,
        ),
    }
    return {name: to_cloudevent(envelope_for_event(event, at)) for name, (event, at) in events.items()}
