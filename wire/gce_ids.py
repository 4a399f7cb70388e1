"""The ids of GCE maintenance notices (docs/contracts.md#deterministic-ids), shared by the agent,
which reads the notices from the metadata server, and the functions, which read the same notices
from the Compute API: one notice has one id whichever path it came by.

GCE has no event ids, so one is derived: SHA-256 of `instance_id|key|anchor`, where the key is the
metadata key the notice came from and the anchor the first-observed time or, for
upcoming-maintenance, its stable windowStartTime.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from wire.timefmt import format_rfc3339

MAINTENANCE_EVENT_KEY = "maintenance-event"
UPCOMING_MAINTENANCE_KEY = "upcoming-maintenance"
PREEMPTED_KEY = "preempted"


def gce_event_id(instance_id: str, key: str, anchor: str | datetime) -> str:
    """The derived id of a GCE notice: SHA-256 of `instance_id|key|anchor`."""
    anchor_text = format_rfc3339(anchor) if isinstance(anchor, datetime) else anchor
    return hashlib.sha256(f"{instance_id}|{key}|{anchor_text}".encode()).hexdigest()
