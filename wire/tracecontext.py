"""W3C Trace Context (https://www.w3.org/TR/trace-context/) for one maintenance, end to end.

The agent starts a trace when it first sees a maintenance event, and every envelope of that event
(its `scheduled`, `started`, `completed` ...) carries the same trace id, each publish with a span id
of its own, in the CloudEvents Distributed Tracing extension attributes `traceparent` and
`tracestate` (docs/contracts.md#trace-context). The functions read it from the envelope, write the
trace id into every audit record and log line of the event, and pass it on in the commands they
send for it; the agent logs it and keeps it with what it carried out.

Everything that reads a trace context got it from a bus, so it is hostile input: `parse` takes only
the exact version-00 form, and a reader that gets anything else ignores it (and starts a trace of
its own) rather than refuse the message. A trace id is a label for joining records, never a reason
to act or to refuse.

Standard library only, and ids from `os.urandom` (the source `secrets` reads, without loading it
and `hmac` into every agent): the agent pays nothing for tracing but 24 random bytes and some
90 bytes of attributes per envelope, whether or not anything exports traces.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# Version 00 is the only one this reader knows: "00-" 32 hex "-" 16 hex "-" 2 hex, lowercase.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
TRACEPARENT_LENGTH = 55
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
# W3C: at most 32 list members; a vendor may drop a tracestate longer than 512 characters, and
# this one does (it only passes tracestate on, so a longer one is someone else's payload).
MAX_TRACESTATE_CHARS = 512
MAX_TRACESTATE_MEMBERS = 32
_STATE_KEY = re.compile(r"[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13}")
# Printable ASCII but `,` and `=`, at most 256 characters, not ending in a space.
_STATE_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
# Sampled: a downstream parent-based sampler records what the agent started (it has no sampler
# of its own, and records nothing itself).
SAMPLED = "01"
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


class TraceContextError(ValueError):
    """A `traceparent` or `tracestate` that is not W3C's version-00 form; the message says why,
    without repeating the value (it may be any size)."""


@dataclass(frozen=True)
class TraceContext:
    """One position in a trace: the trace, the span that carries it onward, its flags, and the
    vendors' `tracestate` passed on untouched (None: none)."""

    trace_id: str
    span_id: str
    flags: str = SAMPLED
    tracestate: str | None = None

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def child(self) -> TraceContext:
        """The next hop of the same trace: a new span id, the rest kept."""
        return TraceContext(self.trace_id, new_span_id(), self.flags, self.tracestate)

    def attributes(self) -> dict[str, str]:
        """The extension attributes (or command fields) that carry it."""
        carried = {TRACEPARENT: self.traceparent}
        if self.tracestate is not None:
            carried[TRACESTATE] = self.tracestate
        return carried


def new_trace_id() -> str:
    while True:
        trace_id = os.urandom(16).hex()
        if trace_id != _ZERO_TRACE:  # all zeros is invalid; 2**-128, but never sent
            return trace_id


def new_span_id() -> str:
    while True:
        span_id = os.urandom(8).hex()
        if span_id != _ZERO_SPAN:
            return span_id


def new_trace(trace_id: str | None = None) -> TraceContext:
    """A trace started here (or a new span of `trace_id`, a trace already started here)."""
    return TraceContext(trace_id if trace_id is not None else new_trace_id(), new_span_id())


def is_trace_id(value: object) -> bool:
    """Whether `value` is a trace id as this module writes it (kept state is read through this)."""
    return isinstance(value, str) and _TRACE_ID.fullmatch(value) is not None and value != _ZERO_TRACE


def parse(traceparent: object, tracestate: object = None) -> TraceContext:
    """The trace context of a `traceparent` (and `tracestate`) as received.

    A `tracestate` that is not W3C's form is dropped and the `traceparent` kept, as the
    recommendation says; its problem is not raised.

    Raises:
        TraceContextError: `traceparent` is not a version-00 traceparent: not a string, not 55
            characters, upper-case hex, an all-zero trace or span id, another version.
    """
    if not isinstance(traceparent, str):
        raise TraceContextError(f"traceparent must be a string, got {type(traceparent).__name__}")
    if len(traceparent) != TRACEPARENT_LENGTH:
        raise TraceContextError(f"traceparent is {len(traceparent)} characters; version 00 has {TRACEPARENT_LENGTH}")
    found = _TRACEPARENT.fullmatch(traceparent)
    if found is None:
        raise TraceContextError(
            "traceparent is not 00-<32 lowercase hex>-<16 lowercase hex>-<2 lowercase hex> (version 00)"
        )
    trace_id, span_id, flags = found.groups()
    if trace_id == _ZERO_TRACE:
        raise TraceContextError("traceparent has an all-zero trace id")
    if span_id == _ZERO_SPAN:
        raise TraceContextError("traceparent has an all-zero parent id")
    state = tracestate if isinstance(tracestate, str) and _valid_tracestate(tracestate) else None
    return TraceContext(trace_id, span_id, flags, state)


def _valid_tracestate(value: str) -> bool:
    if not value or len(value) > MAX_TRACESTATE_CHARS:
        return False
    members = [member.strip(" \t") for member in value.split(",")]
    members = [member for member in members if member]  # empty members are allowed, and ignored
    if not members or len(members) > MAX_TRACESTATE_MEMBERS:
        return False
    keys = set()
    for member in members:
        key, equals, state = member.partition("=")
        # fullmatch: `$` would let a trailing newline through
        if not equals or not _STATE_KEY.fullmatch(key) or not _STATE_VALUE.fullmatch(state) or key in keys:
            return False
        keys.add(key)
    return True


def received(carrier: Mapping[str, Any]) -> tuple[TraceContext | None, str | None]:
    """The trace context carried by a message's attributes (an envelope's extensions, a command's
    fields): (context, None); (None, None) when it carries none; (None, why) when what it carries
    is not one, for the reader to log before it starts a trace of its own."""
    if TRACEPARENT not in carrier:
        return None, None
    try:
        return parse(carrier[TRACEPARENT], carrier.get(TRACESTATE)), None
    except TraceContextError as exc:
        return None, str(exc)
