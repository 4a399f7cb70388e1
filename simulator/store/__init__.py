"""Shared simulator state: the Azure event store, the timeline that moves it, the approvals, the
central feed and the log.

One `threading.Condition` (over an RLock) guards all of it. Every HTTP handler thread, the timeline
thread and GCE long-polls use that same condition, so any change wakes whoever waits for one; the
simulator holds little state and its critical sections are short, so one lock is simpler than many.
The names the other simulator modules use are exported here.
"""

from __future__ import annotations

from simulator.store.approvals import ApprovalRecord, ApprovalResult
from simulator.store.azure_events import (
    ApprovalRule,
    EventSource,
    EventSpec,
    EventStatus,
    EventType,
    SimEvent,
)
from simulator.store.central_feed import AzureHome, CentralFeed, FeedStatus
from simulator.store.event_specs import bool_field, parse_event_spec
from simulator.store.event_store import EventStore
from simulator.store.log import LogEntry, SimLog
from simulator.store.requests import Cloud, FieldError, MetadataRequest, RequestError, Response
from simulator.store.timeline import Timeline

__all__ = [
    "ApprovalRecord",
    "ApprovalResult",
    "ApprovalRule",
    "AzureHome",
    "CentralFeed",
    "Cloud",
    "EventSource",
    "EventSpec",
    "EventStatus",
    "EventStore",
    "EventType",
    "FeedStatus",
    "FieldError",
    "LogEntry",
    "MetadataRequest",
    "RequestError",
    "Response",
    "SimEvent",
    "SimLog",
    "Timeline",
    "bool_field",
    "parse_event_spec",
]
