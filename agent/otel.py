"""The agent's spans of each maintenance's trace, exported over OTLP/HTTP (protobuf) to a local
collector: the Azure Monitor Agent, Google's Ops Agent, an OpenTelemetry Collector.

Imported only with --otlp-endpoint (MBRIDGE_OTLP_ENDPOINT): without it no OpenTelemetry module is
loaded (agent/main.py). It needs the `agent-otel` extra, which the agent's artifacts do not carry.

The spans carry the ids the agent already puts on the wire (agent/traces.py):

- `mbridge.detect`, the root: the poll that first saw the maintenance, to its first envelope in the
  outbox; trace id the envelopes', span id `detection_span_id(trace id)`;
- `mbridge.publish`, a child of it for each envelope: from the observation to the bus taking it;
  span id the envelope's `traceparent` span id, the parent the functions' invocation names;
- `mbridge.command`, carrying out a command, under the span its `traceparent` names (the functions'
  invocation that sent it); `mbridge.approve`, an approval's POST to the metadata service, its child.

The SDK picks a span's own id from its IdGenerator; `_ChosenIds` hands it the agent's instead, on
the thread that starts the span. The provider is this module's own, never the global one (a bus
SDK may set that up). Spans go through a BatchSpanProcessor: its thread exports, never a poll, a
publish or a command. What the library logs (an export that failed, a full queue) reaches the
agent's log at most once every REPORT_EVERY_SECONDS, with a count of the lines left out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Callable, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from agent.commands.ports import Approver
from agent.messages import trace_of
from agent.sources.azure.document import ScheduledEventsDocument
from agent.timing import Clock
from agent.traces import detection_span_id
from wire.commands import Command
from wire.model import Cloud, CommandResult, MaintenanceEvent
from wire.tracecontext import TraceContext
from wire.transports.base import OutboundMessage
from wire.version import version

LOGGER = logging.getLogger("mbridge.agent.otel")

SCOPE = "mbridge.agent"
SERVICE_NAME = "maintenance-bridge-agent"
DETECT = "mbridge.detect"
PUBLISH = "mbridge.publish"
COMMAND = "mbridge.command"
APPROVE = "mbridge.approve"
TRACES_PATH = "/v1/traces"
# OpenTelemetry's names of the clouds and their VM platforms (semantic conventions, cloud.*).
CLOUD_PROVIDER = {Cloud.AZURE: "azure", Cloud.GCE: "gcp"}
CLOUD_PLATFORM = {Cloud.AZURE: "azure_vm", Cloud.GCE: "gcp_compute_engine"}
# One request to a local collector; a batch that fails is dropped (the next goes on).
EXPORT_TIMEOUT_SECONDS = 5.0
# How long a stopping agent waits for what is queued to go out.
CLOSE_SECONDS = 3.0
# The library's own log lines (an export that failed, each retry, a full queue) are let through
# at most this often: a collector that is down would otherwise put a few lines in the log every
# few seconds.
REPORT_EVERY_SECONDS = 300.0
LIBRARY_LOGGER = "opentelemetry"

_T = TypeVar("_T")


class _ChosenIds(IdGenerator):
    """Random ids, but for the span started next on this thread, which gets the ids `choose` named."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._chosen = threading.local()

    def choose(self, trace_id: int | None, span_id: int | None) -> None:
        self._chosen.trace_id = trace_id
        self._chosen.span_id = span_id

    def generate_trace_id(self) -> int:
        chosen: int | None = getattr(self._chosen, "trace_id", None)
        return self._random.generate_trace_id() if chosen is None else chosen

    def generate_span_id(self) -> int:
        chosen: int | None = getattr(self._chosen, "span_id", None)
        return self._random.generate_span_id() if chosen is None else chosen


class _LibraryLog(logging.Handler):
    """The OpenTelemetry library's log lines into the agent's log, one every `every` seconds at most,
    saying how many were left out since the last (`monotonic` times it)."""

    def __init__(self, every: float, monotonic: Callable[[], float]) -> None:
        super().__init__(logging.WARNING)
        self._every = every
        self._monotonic = monotonic
        self._next: float | None = None
        self.left_out = 0

    def emit(self, record: logging.LogRecord) -> None:
        now = self._monotonic()
        if self._next is not None and now < self._next:
            self.left_out += 1
            return
        self._next = now + self._every
        left_out, self.left_out = self.left_out, 0
        try:
            text = record.getMessage()
        except Exception:  # arguments that do not match the format
            text = str(record.msg)
        more = f" ({left_out} more such line(s) left out before it)" if left_out else ""
        LOGGER.warning(
            "span export: %s%s; spans that cannot be exported are dropped, the agent goes on; "
            "the next such line in %.0f s at the earliest",
            text,
            more,
            self._every,
        )


class OtlpSpans:
    """The agent's spans (agent.traces.Spans) through `processor`: a BatchSpanProcessor on the OTLP
    exporter in the agent (`open_spans`), the SDK's in-memory exporter in tests. `clock` gives the
    times of the spans the agent times itself (commands, approvals)."""

    def __init__(
        self,
        processor: SpanProcessor,
        *,
        cloud: Cloud,
        vm_name: str,
        clock: Clock,
        report_every: float = REPORT_EVERY_SECONDS,
    ) -> None:
        resource = Resource.create(
            {
                "service.name": SERVICE_NAME,
                "service.version": version(),
                "service.instance.id": vm_name,
                "host.name": vm_name,
                "cloud.provider": CLOUD_PROVIDER[cloud],
                "cloud.platform": CLOUD_PLATFORM[cloud],
            }
        )
        self._ids = _ChosenIds()
        self.provider = TracerProvider(resource=resource, id_generator=self._ids)
        self.provider.add_span_processor(processor)
        self._tracer = self.provider.get_tracer(SCOPE, version())
        self._clock = clock
        self._cloud = cloud
        # Span starts that choose ids, one at a time (the ids are per thread; this keeps it simple).
        self._lock = threading.Lock()
        self.library_log = _LibraryLog(report_every, clock.monotonic)
        library = logging.getLogger(LIBRARY_LOGGER)
        library.addHandler(self.library_log)
        library.propagate = False  # its lines reach the agent's log through library_log only

    # ---- agent.traces.Spans

    def detected(self, event: MaintenanceEvent, trace: TraceContext, observed_at: datetime, recorded: datetime) -> None:
        def record() -> None:
            span = self._start(
                DETECT,
                Context(),
                (int(trace.trace_id, 16), int(detection_span_id(trace.trace_id), 16)),
                SpanKind.INTERNAL,
                observed_at,
                {
                    "mbridge.event_id": event.event_id,
                    "mbridge.event_kind": event.kind.value,
                    "mbridge.status": event.status.value,
                    "mbridge.concerns_this_vm": event.concerns_reporter,
                },
            )
            span.end(_nanos(max(recorded, observed_at)))

        self._guarded("detection", record)

    def published(self, message: OutboundMessage, observed: datetime, published: datetime) -> None:
        def record() -> None:
            carried = trace_of(message)
            if carried is None:  # a row an earlier version recorded
                return
            parent = _parent(carried.trace_id, detection_span_id(carried.trace_id), carried, remote=False)
            span = self._start(
                PUBLISH,
                parent,
                (None, int(carried.span_id, 16)),
                SpanKind.PRODUCER,
                min(observed, published),
                {
                    "mbridge.envelope_id": message.envelope_id,
                    "mbridge.event_id": str(message.attributes.get("event_id", "")),
                    "mbridge.type": str(message.attributes.get("type", "")),
                },
            )
            span.end(_nanos(published))

        self._guarded("publish", record)

    @contextmanager
    def command(self, command: Command) -> Iterator[Callable[[CommandResult], None]]:
        results: list[CommandResult] = []

        def start() -> Span:
            sent = command.trace
            parent = Context() if sent is None else _parent(sent.trace_id, sent.span_id, sent, remote=True)
            return self._start(
                COMMAND,
                parent,
                (None, None),
                SpanKind.CONSUMER,
                self._clock.now(),
                {
                    "mbridge.command_id": command.command_id,
                    "mbridge.command_type": command.type.value,
                    "mbridge.event_id": command.event_id,
                },
            )

        span = self._guarded("command", start)
        if span is None:
            yield results.append
            return
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            yield results.append
        except BaseException as exc:
            failure = exc
            self._guarded("command", lambda: _failed(span, failure))
            raise
        finally:
            otel_context.detach(token)
            self._guarded("command", lambda: self._end_command(span, results))

    def approver(self, approver: Approver) -> Approver:
        return _TracedApprover(approver, self)

    def close(self) -> None:
        """Export what is queued, for at most CLOSE_SECONDS (a collector that is down must not hold
        up a stopping agent), then let the library's log go back to its own handlers."""
        closing = threading.Thread(target=self.provider.shutdown, name="span-export-close", daemon=True)
        closing.start()
        closing.join(CLOSE_SECONDS)
        library = logging.getLogger(LIBRARY_LOGGER)
        library.removeHandler(self.library_log)
        if not any(isinstance(handler, _LibraryLog) for handler in library.handlers):
            library.propagate = True

    # ---- inside

    def approval_span(self, event_id: str) -> Span | None:
        """A span of an approval's POST, under the command's span current on this thread."""
        return self._guarded(
            "approval",
            lambda: self._start(
                APPROVE,
                None,
                (None, None),
                SpanKind.CLIENT,
                self._clock.now(),
                {"mbridge.event_id": event_id, "http.request.method": "POST"},
            ),
        )

    def end_approval(self, span: Span, error: BaseException | None) -> None:
        def end() -> None:
            if error is not None:
                _failed(span, error)
            span.end(_nanos(self._clock.now()))

        self._guarded("approval", end)

    def _start(
        self,
        name: str,
        parent: Context | None,
        ids: tuple[int | None, int | None],
        kind: SpanKind,
        start: datetime,
        attributes: dict[str, str | bool],
    ) -> Span:
        attributes = {**attributes, "cloud.provider": CLOUD_PROVIDER[self._cloud]}
        with self._lock:
            self._ids.choose(*ids)
            try:
                return self._tracer.start_span(
                    name, context=parent, kind=kind, attributes=attributes, start_time=_nanos(start)
                )
            finally:
                self._ids.choose(None, None)

    def _end_command(self, span: Span, results: list[CommandResult]) -> None:
        for result in results:
            span.set_attribute("mbridge.result", result.result)
            span.set_attribute("mbridge.reason", result.reason)
        span.end(_nanos(self._clock.now()))

    def _guarded(self, what: str, record: Callable[[], _T]) -> _T | None:
        """`record()`, or None when it failed: a span is never worth a step of the agent."""
        try:
            return record()
        except Exception as exc:
            self.library_log.handle(
                logging.LogRecord(
                    LIBRARY_LOGGER, logging.WARNING, __file__, 0, "%s span not recorded: %r", (what, exc), None
                )
            )
            return None


class _TracedApprover:
    """An Approver whose approval POSTs are spans (agent.commands.ports.Approver)."""

    def __init__(self, approver: Approver, spans: OtlpSpans) -> None:
        self._approver = approver
        self._spans = spans

    def fetch_document(self) -> ScheduledEventsDocument:
        return self._approver.fetch_document()

    def post_approval(self, event_id: str) -> None:
        span = self._spans.approval_span(event_id)
        try:
            self._approver.post_approval(event_id)
        except BaseException as exc:
            if span is not None:
                self._spans.end_approval(span, exc)
            raise
        if span is not None:
            self._spans.end_approval(span, None)


def open_spans(endpoint: str, *, cloud: Cloud, vm_name: str, clock: Clock) -> OtlpSpans:
    """The agent's spans, batched and exported to the collector at `endpoint` (its base URL).
    Nothing is sent before the first span; a collector that is not there is only logged."""
    exporter = OTLPSpanExporter(endpoint=endpoint + TRACES_PATH, timeout=EXPORT_TIMEOUT_SECONDS)
    spans = OtlpSpans(BatchSpanProcessor(exporter), cloud=cloud, vm_name=vm_name, clock=clock)
    LOGGER.info("exporting spans to %s", endpoint + TRACES_PATH)
    return spans


def _parent(trace_id: str, span_id: str, carried: TraceContext, *, remote: bool) -> Context:
    """A context whose current span is the (non-recording) span `span_id` of `trace_id`."""
    state = TraceState.from_header([carried.tracestate]) if carried.tracestate else None
    span_context = SpanContext(
        int(trace_id, 16),
        int(span_id, 16),
        is_remote=remote,
        trace_flags=TraceFlags(int(carried.flags, 16)),
        trace_state=state,
    )
    return trace.set_span_in_context(NonRecordingSpan(span_context), Context())


def _failed(span: Span, error: BaseException) -> None:
    span.set_attribute("error.type", type(error).__qualname__)
    span.set_status(Status(StatusCode.ERROR, str(error)[:200]))


def _nanos(moment: datetime) -> int:
    """Nanoseconds since the epoch, to the microsecond the clock gives."""
    return round(moment.timestamp() * 1_000_000) * 1_000
