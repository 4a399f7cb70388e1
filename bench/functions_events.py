"""Azure maintenance events and their envelopes, built the way an agent builds them.

An event starts as an entry of an IMDS Scheduled Events document; it goes through the product's
own parser and mapping (`parse_scheduled_events`, `to_maintenance_event`) and is wrapped with
`envelope_for_event`, so the function-core benchmarks feed `process` exactly what an agent
would publish: same fields, same envelope id (one per event and status, whoever reports it).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

from agent.sources.azure.document import parse_scheduled_events, to_maintenance_event
from wire.envelope import encode, envelope_for_event
from wire.model import EventStatus, MaintenanceEvent
from wire.timefmt import format_rfc1123

# What the simulator (and Azure, for a user restart) describes a Reboot with.
REBOOT_DESCRIPTION = "Virtual machine is going to be restarted as requested by authorized user."
# The shortest notice Azure gives a Reboot.
REBOOT_NOTICE = timedelta(minutes=15)


def new_event_id() -> str:
    """An Azure EventId: an upper-case GUID, as IMDS prints it."""
    return str(uuid.uuid4()).upper()


def reboot_entry(event_id: str, resources: Sequence[str], observed_at: datetime, *, source: str) -> dict[str, object]:
    """One `Events` entry of a Scheduled Events document (api-version 2020-07-01): a Reboot of
    `resources` with the documented 15 minutes of notice, from `source` ("User" or "Platform")."""
    return {
        "EventId": event_id,
        "EventStatus": "Scheduled",
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": list(resources),
        "NotBefore": format_rfc1123(observed_at + REBOOT_NOTICE),
        "Description": REBOOT_DESCRIPTION,
        "EventSource": source,
        "DurationInSeconds": -1,
    }


def reported_event(entry: dict[str, object], reporter: str, incarnation: int) -> MaintenanceEvent:
    """The `scheduled` event `reporter`'s agent derives from a document holding `entry`."""
    document = parse_scheduled_events(json.dumps({"DocumentIncarnation": incarnation, "Events": [entry]}))
    (parsed,) = document.events
    return to_maintenance_event(parsed, status=EventStatus.SCHEDULED, reporter=reporter, sequence=str(incarnation))


def envelope_body(event: MaintenanceEvent, observed_at: datetime) -> bytes:
    """The message body the agent publishes for `event` seen at `observed_at`."""
    return encode(envelope_for_event(event, observed_at))


def completion(event: MaintenanceEvent, incarnation: int) -> MaintenanceEvent:
    """The same event once it is gone from the document after Started: `completed`."""
    return event.with_status(EventStatus.COMPLETED, sequence=str(incarnation))
