"""OpenTelemetry spans and metrics of the functions' invocations (the core's `Telemetry` port).

Every entry point's invocation is one span named for its operation (`mbridge.process`,
`mbridge.central`, `mbridge.sweep`, `mbridge.recover`), and its metrics carry the operation as the
label `operation`.

Imported only when MBRIDGE_TELEMETRY names an exporter (functions/telemetry/__init__.py): with the
default, no OpenTelemetry module is loaded.

Each invocation is one span of the maintenance's trace with the ids the core gave it: the trace
id of the audit records, the envelope's span as parent, and as its own id the span id the
commands for the event carry, so an exported trace joins the agent's spans, and a command found in
the agent's ledger names the span that sent it. The SDK picks a span's own id itself, from its
`IdGenerator`; `_GivenIds` hands it the core's instead, on the thread that starts the span. The
parent is a remote, non-recording span built from the trace context, so nothing else of the
process's context (a current span of the Functions host's, say) is taken as the parent.

The providers are this adapter's own, never the global ones: the function hosts and SDK clients
may set up theirs, and neither should export the other's spans.

With `flush_seconds`, each invocation's span and metrics are exported before `invocation` returns
(`force_flush`, for at most that long; a failure is logged, never raised): Cloud Functions may
throttle the instance's CPU once the request is answered, and the SDK's export threads would not
run until the next request came, or never (functions/telemetry/__init__.py says which app does it).
Metrics are flushed at most once every `METRICS_FLUSH_GAP_SECONDS`: Cloud Monitoring takes one
point of a series every five seconds at most, and the sums are cumulative, so what a skipped flush
held goes with the next export.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from functions.core.telemetry import CENTRAL, FAILED, PROCESS, InvocationReport
from wire.tracecontext import TraceContext

LOGGER = logging.getLogger("mbridge.functions.telemetry")

SCOPE = "mbridge.functions"
SPAN_PREFIX = "mbridge."
SPAN_NAME = SPAN_PREFIX + PROCESS  # an agent's message; the other operations' spans are named alike
# Operations that consume a message of a bus (a span of kind CONSUMER); the others, a timer's or an
# operator's, are INTERNAL.
CONSUMING = frozenset({PROCESS, CENTRAL})
SERVICE_NAME = "maintenance-bridge-functions"

# Metric names (docs/operations.md#telemetry); seconds throughout, as OpenTelemetry's conventions do.
INVOCATION_DURATION = "mbridge.invocation.duration"
ACTIONS = "mbridge.actions"
REFUSALS = "mbridge.refusals"
NOTICE_TO_ACTION = "mbridge.notice_to_action"
NOT_BEFORE_MARGIN = "mbridge.not_before_margin"
BUDGET_WAIT = "mbridge.budget_wait.duration"
# Measured from a notice to the drain or approval that answers it; a restore answers an end.
NOTICED_ACTIONS = frozenset({"drain", "approve"})
# Span attributes, beside OpenTelemetry's error.type on a failed invocation.
ATTRIBUTE_PREFIX = "mbridge."
# Links of one span to the parts it acted on, at most (the SDK's own limit is 128).
MAX_LINKS = 100

# Metrics are flushed with an invocation at most this often (Cloud Monitoring: a point of a series
# every five seconds at most).
METRICS_FLUSH_GAP_SECONDS = 10.0

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class _GivenIds(IdGenerator):
    """The SDK's ids, but for the span being started on this thread, which gets the core's."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._given = threading.local()

    def give(self, trace_id: int | None, span_id: int | None) -> None:
        self._given.trace_id, self._given.span_id = trace_id, span_id

    def generate_trace_id(self) -> int:
        given = getattr(self._given, "trace_id", None)
        self._given.trace_id = None
        return given if given is not None else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        given = getattr(self._given, "span_id", None)
        self._given.span_id = None
        return given if given is not None else self._random.generate_span_id()


class OtelTelemetry:
    """Spans through `span_processor`, metrics through `metric_readers` (an exporter's periodic
    reader in the apps, the SDK's in-memory ones in tests); with `flush_seconds`, both flushed after
    each invocation (`monotonic` times the gap between metric flushes)."""

    def __init__(
        self,
        span_processor: SpanProcessor | None,
        metric_readers: Sequence[MetricReader],
        *,
        cloud: str,
        resource: Resource | None = None,
        flush_seconds: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        resource = resource or Resource.create({"service.name": SERVICE_NAME, "cloud.provider": cloud})
        self._ids = _GivenIds()
        self.tracer_provider = TracerProvider(resource=resource, id_generator=self._ids)
        if span_processor is not None:  # else given by `exporting` once the provider exists
            self.tracer_provider.add_span_processor(span_processor)
        self._tracer = self.tracer_provider.get_tracer(SCOPE)
        self.meter_provider = MeterProvider(metric_readers=list(metric_readers), resource=resource)
        meter = self.meter_provider.get_meter(SCOPE)
        self._duration = meter.create_histogram(INVOCATION_DURATION, unit="s", description="One invocation of process")
        self._actions = meter.create_counter(ACTIONS, unit="{action}", description="Actions taken, by kind")
        self._refusals = meter.create_counter(REFUSALS, unit="{report}", description="Reports refused, by reason")
        self._notice = meter.create_histogram(
            NOTICE_TO_ACTION, unit="s", description="From the agent seeing a notice to its drain or approval"
        )
        self._margin = meter.create_histogram(
            NOT_BEFORE_MARGIN, unit="s", description="From a drain or approval to the event's NotBefore"
        )
        self._budget_wait = meter.create_histogram(
            BUDGET_WAIT, unit="s", description="How long an event waited in a budget's line"
        )
        # Serialises span starts: `_GivenIds` is per thread, but a processor may start spans of its own.
        self._lock = threading.Lock()
        self._flush_seconds = flush_seconds
        self._monotonic = monotonic
        self._metrics_flushed: float | None = None

    def invocation(self, report: InvocationReport) -> None:
        self._span(report)
        self._measure(report)
        if self._flush_seconds is not None:
            self.flush(self._flush_seconds)

    def flush(self, seconds: float) -> None:
        """Export what the processor and the readers hold, waiting at most `seconds` for each; what
        fails is logged (the invocation it follows is done either way). Metrics are left to the next
        flush when the last one was less than `METRICS_FLUSH_GAP_SECONDS` ago."""
        millis = max(1, int(seconds * 1000))
        self._flushed("spans", lambda: self.tracer_provider.force_flush(millis))
        now = self._monotonic()
        if self._metrics_flushed is None or now - self._metrics_flushed >= METRICS_FLUSH_GAP_SECONDS:
            self._metrics_flushed = now
            self._flushed("metrics", lambda: self.meter_provider.force_flush(millis))

    @staticmethod
    def _flushed(what: str, flush: Callable[[], bool]) -> None:
        try:
            if not flush():
                LOGGER.warning("telemetry: %s not exported in time after the invocation", what)
        except Exception:
            LOGGER.warning("telemetry: %s not exported after the invocation", what, exc_info=True)

    def shutdown(self) -> None:
        """Export what is pending and stop (the worker is going away)."""
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()

    def _span(self, report: InvocationReport) -> None:
        own = report.trace
        attributes = {ATTRIBUTE_PREFIX + name: value for name, value in report.attributes().items()}
        if report.error:
            attributes["error.type"] = report.error
        with self._lock:
            self._ids.give(
                int(own.trace_id, 16) if own is not None else None, int(own.span_id, 16) if own is not None else None
            )
            span = self._tracer.start_span(
                SPAN_PREFIX + report.operation,
                context=_parent(own, report.parent_span_id),
                kind=SpanKind.CONSUMER if report.operation in CONSUMING else SpanKind.INTERNAL,
                attributes=attributes,
                links=_links(report.links),
                start_time=_nanoseconds(report.started),
            )
            self._ids.give(None, None)  # a span the sampler dropped took none of them
        for action in report.actions:
            span.add_event(
                f"{ATTRIBUTE_PREFIX}{action.action}",
                {f"{ATTRIBUTE_PREFIX}action": action.action},
                timestamp=_nanoseconds(action.taken_at),
            )
        if report.result == FAILED:
            span.set_status(Status(StatusCode.ERROR, report.error))
        span.end(end_time=_nanoseconds(report.ended or report.started))

    def _measure(self, report: InvocationReport) -> None:
        operation = report.operation
        self._duration.record(report.seconds, {"operation": operation, "result": report.result})
        for refusal in report.refusals:
            self._refusals.add(1, {"operation": operation, "reason": refusal})
        for action in report.actions:
            self._actions.add(1, {"operation": operation, "action": action.action})
            if action.action not in NOTICED_ACTIONS:
                continue
            labels = {"action": action.action}
            self._notice.record(max(0.0, (action.taken_at - action.noticed_at).total_seconds()), labels)
            if action.not_before is not None:
                # Negative when the action came after NotBefore: the platform may have gone ahead.
                self._margin.record((action.not_before - action.taken_at).total_seconds(), labels)
        for waited in report.budget_waits:
            self._budget_wait.record(waited, {"operation": operation})


def _parent(own: TraceContext | None, parent_span_id: str | None) -> Context:
    """The context a span starts in: the envelope's span as a remote parent, or none (a root span,
    of the trace the functions started, or of one the SDK picks when no envelope was read)."""
    if own is None or parent_span_id is None:
        return Context()
    remote = SpanContext(
        trace_id=int(own.trace_id, 16),
        span_id=int(parent_span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(own.flags, 16)),
        # already checked to be W3C's form by wire.tracecontext; the SDK checks it again
        trace_state=TraceState.from_header([own.tracestate]) if own.tracestate else None,
    )
    return trace.set_span_in_context(NonRecordingSpan(remote), Context())


def _links(parts: Sequence[TraceContext]) -> list[Link]:
    """Links to the spans of the parts an invocation of several acted on, the first MAX_LINKS of
    them (a reconciliation pass may act on thousands; the SDK would drop past its own limit)."""
    return [
        Link(SpanContext(int(part.trace_id, 16), int(part.span_id, 16), is_remote=True, trace_flags=TraceFlags(1)))
        for part in parts[:MAX_LINKS]
    ]


def _nanoseconds(moment: datetime) -> int:
    """Nanoseconds since the epoch, in integers: a float of them loses the microseconds."""
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000
