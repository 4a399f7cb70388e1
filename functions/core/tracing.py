"""The trace of the maintenance a message is about, as the functions carry it (wire/tracecontext.py).

An invocation is one span of the event's trace: a child of the envelope's `traceparent`, or the
first span of a new trace when the envelope carries none (an agent older than traces, the
control plane's feeds) or carries one that is not W3C's form (logged, and otherwise ignored: it
came from a bus). Its trace id goes into every audit record and log line about the event.

Commands carry the invocation's span only to an agent whose report carried a trace context:
older agents refuse unknown command fields (docs/contracts.md#trace-context). The drain and
restore commands of `ReadinessBalancer` are sent from below the LoadBalancer port, which knows
VMs and mementos but not events; the span reaches them through `for_commands`, set around the
call by whoever acts for the event (`commands_traced`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from functions.core.log_fields import fields
from wire.bounds import bounded
from wire.envelope import Envelope
from wire.tracecontext import TraceContext, new_trace, received

LOGGER = logging.getLogger("mbridge.functions")

_FOR_COMMANDS: ContextVar[TraceContext | None] = ContextVar("mbridge_command_trace", default=None)


def span_of(envelope: Envelope) -> tuple[TraceContext, str | None]:
    """This invocation's span of the envelope's trace, and the envelope's own span id, its parent
    (None: the envelope carried no trace context, and its sender takes none in commands)."""
    carried, problem = received(envelope.extensions)
    if carried is not None:
        return carried.child(), carried.span_id
    started = new_trace()
    if problem is not None:
        LOGGER.warning(
            "envelope %s carries a trace context that is not one, ignored (trace %s started): %s",
            envelope.id[:16],
            started.trace_id,
            bounded(problem),
            extra=fields(envelope_id=envelope.id, trace_id=started.trace_id),
        )
    return started, None


def carried_trace(envelope: Envelope) -> TraceContext | None:
    """The trace context an envelope carries, or None (a command result of an agent older than
    traces, or one whose trace context is not one: a result's is only passed on, not logged)."""
    carried, _ = received(envelope.extensions)
    return carried


@contextmanager
def commands_traced(trace: TraceContext | None) -> Iterator[None]:
    """Commands sent within carry `trace` (None: none)."""
    token = _FOR_COMMANDS.set(trace)
    try:
        yield
    finally:
        _FOR_COMMANDS.reset(token)


def for_commands() -> TraceContext | None:
    """The trace context a command sent now carries (see `commands_traced`)."""
    return _FOR_COMMANDS.get()
