"""Which trace each maintenance event belongs to: one trace per event, started when the agent first
publishes it, kept for its later steps across restarts (docs/contracts.md#trace-context).

Saved as a source state, in the transaction that records the envelopes it went into, so an
envelope in the outbox and the trace on disk always agree; an event that ended leaves it, and
the oldest go once MAX_TRACES are kept (a GCE preemption has no end to say it is over).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wire.model import Cloud, EventStatus, MaintenanceEvent
from wire.tracecontext import TraceContext, is_trace_id, new_trace

TRACES_STATE = "maintenance_traces"
# A VM has a handful of open events; with --forward all, those of its set. An event whose trace
# was dropped gets a new one for its later steps, which only splits its trace in two.
MAX_TRACES = 64
_ENDED = frozenset({EventStatus.COMPLETED, EventStatus.CANCELED})


def event_key(event: MaintenanceEvent) -> str:
    """The event across its steps; Azure's EventIds in any case (IMDS prints them either way)."""
    event_id = event.event_id.lower() if event.cloud is Cloud.AZURE else event.event_id
    return f"{event.cloud.value}:{event_id}"


class Traces:
    """The trace ids of the events published and not ended, oldest first."""

    def __init__(self, saved: Any) -> None:
        self._ids = _load(saved)

    def plan(self, events: Sequence[MaintenanceEvent]) -> tuple[list[TraceContext], dict[str, str]]:
        """The trace context of each event's envelope (its event's trace, a new span), and the trace
        ids to keep once they are recorded. Nothing changes until `commit`."""
        after = dict(self._ids)
        contexts = []
        for event in events:
            key = event_key(event)
            context = new_trace(after.pop(key, None))
            contexts.append(context)
            if event.status not in _ENDED:
                after[key] = context.trace_id  # last used, last out
        while len(after) > MAX_TRACES:
            del after[next(iter(after))]
        return contexts, after

    def changed(self, after: dict[str, str]) -> bool:
        return list(after.items()) != list(self._ids.items())

    def commit(self, after: dict[str, str]) -> None:
        self._ids = after

    @staticmethod
    def saved(after: dict[str, str]) -> list[list[str]]:
        """What goes into the source state: [key, trace id] pairs, oldest first."""
        return [[key, trace_id] for key, trace_id in after.items()]


def _load(saved: Any) -> dict[str, str]:
    """The traces saved by the last run; what does not read as one is left out (a new trace then)."""
    ids: dict[str, str] = {}
    if not isinstance(saved, list):
        return ids
    for item in saved[-MAX_TRACES:]:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and is_trace_id(item[1]):
            ids[item[0]] = item[1]
    return ids
