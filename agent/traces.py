"""Which trace each maintenance event belongs to: one trace per event, started when the agent first
publishes it, kept for its later steps across restarts (docs/contracts.md#trace-context).

Saved as a source state, in the transaction that records the envelopes it went into, so an
envelope in the outbox and the trace on disk always agree; an event that ended leaves it, and
the oldest go once MAX_TRACES are kept (a GCE preemption has no end to say it is over).

The spans of a trace, when the agent exports them (`Spans`, agent/otel.py; nothing otherwise): the
detection, when the trace starts, is the root, with the id `detection_span_id` derives from the
trace id, so every later publish of the event names it as parent without keeping it on disk, after
a restart too; each publish is its child, with the span id its envelope carries; a command's
handling is a child of the span its command carries (the functions' invocation).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Callable, Protocol

from wire.model import Cloud, EventStatus, MaintenanceEvent
from wire.tracecontext import TraceContext, is_trace_id, new_trace

if TYPE_CHECKING:  # for the annotations only: exporting spans is off by default
    from datetime import datetime

    from agent.commands.ports import Approver
    from wire.commands import Command
    from wire.model import CommandResult
    from wire.transports.base import OutboundMessage

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

    def known(self, event: MaintenanceEvent) -> bool:
        """Whether `event` belongs to a trace already started (False: `plan` starts one for it)."""
        return event_key(event) in self._ids

    def changed(self, after: dict[str, str]) -> bool:
        return list(after.items()) != list(self._ids.items())

    def commit(self, after: dict[str, str]) -> None:
        self._ids = after

    @staticmethod
    def saved(after: dict[str, str]) -> list[list[str]]:
        """What goes into the source state: [key, trace id] pairs, oldest first."""
        return [[key, trace_id] for key, trace_id in after.items()]


def detection_span_id(trace_id: str) -> str:
    """The id of the span that detected the maintenance of `trace_id`, the root of its trace: the
    trace id's last 16 hex digits (its first 16 when those are all zeros; both never are). Random as
    the trace id is, and no publish's span id, which are drawn apart."""
    low = trace_id[16:]
    return low if low.strip("0") else trace_id[:16]


class Spans(Protocol):
    """Where the agent's spans of its maintenances' traces go when it exports them (agent/otel.py).
    Every call returns at once and never raises: an export that fails is the exporter's to log."""

    def detected(self, event: MaintenanceEvent, trace: TraceContext, observed_at: datetime, recorded: datetime) -> None:
        """The maintenance of `event` was first seen at `observed_at`, its trace started, and its
        first envelope (of span `trace`) recorded at `recorded`."""

    def published(self, message: OutboundMessage, observed: datetime, published: datetime) -> None:
        """`message` went onto the bus at `published`; its outbox row's time is `observed` (for an
        event, when the poll that saw it answered)."""

    def command(self, command: Command) -> AbstractContextManager[Callable[[CommandResult], None]]:
        """The span of carrying out `command`, around it; call what it gives with the result."""

    def approver(self, approver: Approver) -> Approver:
        """`approver`, its approval POSTs each a span of the command carried out meanwhile."""

    def close(self) -> None:
        """Export what is pending, for a bounded time, and stop."""


def _load(saved: Any) -> dict[str, str]:
    """The traces saved by the last run; what does not read as one is left out (a new trace then)."""
    ids: dict[str, str] = {}
    if not isinstance(saved, list):
        return ids
    for item in saved[-MAX_TRACES:]:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and is_trace_id(item[1]):
            ids[item[0]] = item[1]
    return ids
