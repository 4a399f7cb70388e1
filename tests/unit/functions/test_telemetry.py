"""Telemetry of the functions' invocations (functions/core/telemetry.py, functions/telemetry/otel.py).

GIVEN process() with the OpenTelemetry adapter on the SDK's in-memory span exporter and metric reader
WHEN  reports are processed: traced, untraced, refused, malformed, with a trace context that is not one
THEN  each invocation is one span of the report's trace, under the envelope's span, whose own id is the
      one the commands sent for it carry; its times are the invocation's clock's; the counters count the
      actions and the refusals; and with telemetry off (the default) the core calls a no-op and nothing of
      OpenTelemetry is loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from functions.core.policy import Policy
from functions.core.process import Deps, process
from functions.core.telemetry import FAILED, NO_TELEMETRY, InvocationReport, NoTelemetry
from functions.local_app.store import SqliteStore
from functions.telemetry import AZURE_MONITOR, GCP, OFF, telemetry_setting
from functions.telemetry.otel import (
    ACTIONS,
    INVOCATION_DURATION,
    METRICS_FLUSH_GAP_SECONDS,
    NOT_BEFORE_MARGIN,
    NOTICE_TO_ACTION,
    REFUSALS,
    SPAN_NAME,
    OtelTelemetry,
)
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.commands import decode_command, encode_command
from wire.envelope import encode, envelope_for_event
from wire.errors import RetryableError
from wire.identity import ReporterName
from wire.model import EventKind, EventStatus, MaintenanceEvent
from wire.tracecontext import TRACEPARENT, TraceContext

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
# When the agent saw the notice, and the NotBefore it reported: the latencies are measured from them.
NOTICED = NOW - timedelta(seconds=40)
NOT_BEFORE = NOW + timedelta(minutes=10)
TRACE = TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01", "rojo=00f067aa0ba902b7")


class Exported:
    """The adapter on the SDK's in-memory exporter and reader."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.metrics = InMemoryMetricReader()
        self.telemetry = OtelTelemetry(SimpleSpanProcessor(self.spans), [self.metrics], cloud="azure")

    def points(self, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
        """The data points of one instrument by their attributes: a counter's sum, a histogram's count and sum."""
        found: dict[tuple[tuple[str, Any], ...], Any] = {}
        data = self.metrics.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        key = tuple(sorted((point.attributes or {}).items()))
                        found[key] = point.value if hasattr(point, "value") else (point.count, point.sum)
        return found


class SlowBalancer(FakeBalancer):
    """Takes a VM out in three seconds of the invocation's clock."""

    def __init__(self, clock: FakeClock, pools: dict[str, tuple[str, ...]]) -> None:
        super().__init__(pools)
        self._clock = clock

    def remove(self, vm: str, memento: Any) -> None:
        self._clock.advance(3)
        super().remove(vm, memento)


class FailingBalancer(FakeBalancer):
    def locate(self, vm: str) -> Any:
        raise RetryableError("the load balancer's API is unreachable")


class Reports:
    """A telemetry that keeps what it is handed."""

    def __init__(self) -> None:
        self.reports: list[InvocationReport] = []

    def invocation(self, report: InvocationReport) -> None:
        self.reports.append(report)


class Broken:
    def invocation(self, report: InvocationReport) -> None:
        raise RuntimeError("the exporter fell over")


@pytest.fixture
def store() -> Iterator[SqliteStore]:
    store = SqliteStore(":memory:")
    yield store
    store.close()


@pytest.fixture
def exported() -> Iterator[Exported]:
    exported = Exported()
    yield exported
    exported.telemetry.shutdown()


def deps(store: SqliteStore, sent: RecordingSender, telemetry: Any, clock: FakeClock, balancer: Any = None) -> Deps:
    return Deps(
        store=store,
        balancer=balancer if balancer is not None else SlowBalancer(clock, {"web": ("web-0", "web-1")}),
        sender=sent,
        audit=store,
        policy=Policy(),
        verifier=ReporterName(),
        monotonic=clock.monotonic,
        telemetry=telemetry,
    )


def reboot(**overrides: Any) -> MaintenanceEvent:
    fields: dict[str, Any] = {
        "kind": EventKind.REBOOT,
        "status": EventStatus.SCHEDULED,
        "reporter": "web-0",
        "resources": ("web-0",),
        "event_id": "E-1",
        "not_before": NOT_BEFORE,
    }
    return azure_event(**{**fields, **overrides})


def report(event: MaintenanceEvent, extensions: dict[str, Any] | None = None) -> bytes:
    return encode(envelope_for_event(event, NOTICED, extensions))


def nanoseconds(moment: datetime) -> int:
    return int((moment - datetime(1970, 1, 1, tzinfo=timezone.utc)) / timedelta(microseconds=1)) * 1000


def test_a_processed_report_is_one_span_of_its_trace_whose_id_is_the_one_its_commands_carry(
    store: SqliteStore, exported: Exported
) -> None:
    # GIVEN a traced report of a platform Reboot of web-0, whose drain takes three seconds
    clock, sent = FakeClock(NOW), RecordingSender()

    # WHEN it is processed with telemetry on
    outcome = process(report(reboot(), TRACE.attributes()), deps(store, sent, exported.telemetry, clock), NOW)

    # THEN one span is exported, of the report's trace, a child of the envelope's span
    (span,) = exported.spans.get_finished_spans()
    assert span.name == SPAN_NAME
    assert span.kind is SpanKind.CONSUMER
    assert span.context is not None
    assert span.parent is not None
    assert f"{span.context.trace_id:032x}" == TRACE.trace_id == outcome.trace_id
    assert f"{span.parent.span_id:016x}" == TRACE.span_id
    assert span.parent.is_remote
    # AND its own id is the span the approval carries: the agent's ledger names the span that sent it
    (approval,) = sent.commands
    onward = decode_command(encode_command(approval)).command.trace
    assert onward is not None
    assert f"{span.context.span_id:016x}" == onward.span_id
    assert span.context.trace_state.get("rojo") == "00f067aa0ba902b7"
    # AND every audit record of the invocation is of that trace
    assert {line.trace_id for line in store.query()} == {TRACE.trace_id}
    # AND its times are the invocation's clock's: it began at `now` and took the drain's three seconds
    assert span.start_time == nanoseconds(NOW)
    assert span.end_time == nanoseconds(NOW + timedelta(seconds=3))
    # AND it names the event, the VM, the cloud and what became of it, with an event per action
    assert span.attributes is not None
    assert {name: span.attributes[name] for name in ("mbridge.event_id", "mbridge.vm", "mbridge.cloud")} == {
        "mbridge.event_id": "E-1",
        "mbridge.vm": "web-0",
        "mbridge.cloud": "azure",
    }
    assert span.attributes["mbridge.result"] == "processed"
    assert [event.name for event in span.events] == ["mbridge.drain", "mbridge.approve"]
    assert span.status.status_code is StatusCode.UNSET


def test_the_counters_count_actions_and_refusals_and_the_latencies_are_measured_from_the_notice(
    store: SqliteStore, exported: Exported
) -> None:
    clock, sent = FakeClock(NOW), RecordingSender()
    run = deps(store, sent, exported.telemetry, clock)

    # GIVEN a report acted on, a report of other VMs (not-self), and a message that is no envelope
    process(report(reboot(), TRACE.attributes()), run, NOW)
    process(report(reboot(reporter="web-0", resources=("web-1",), event_id="E-2")), run, NOW)
    process(b"not json", run, NOW)

    # THEN one drain and one approval were counted, and one refusal of each reason
    assert exported.points(ACTIONS) == {
        (("action", "approve"), ("operation", "process")): 1,
        (("action", "drain"), ("operation", "process")): 1,
    }
    assert exported.points(REFUSALS) == {
        (("operation", "process"), ("reason", "malformed")): 1,
        (("operation", "process"), ("reason", "not-self")): 1,
    }
    # AND three invocations were timed, by what became of them
    assert {key: count for key, (count, _) in exported.points(INVOCATION_DURATION).items()} == {
        (("operation", "process"), ("result", "processed")): 1,
        (("operation", "process"), ("result", "not-self")): 1,
        (("operation", "process"), ("result", "malformed")): 1,
    }
    # AND the VM was out 43 s after the agent saw the notice (40 s before the invocation, and the drain's
    # 3 s), and the approval went then
    assert exported.points(NOTICE_TO_ACTION) == {(("action", "drain"),): (1, 43.0), (("action", "approve"),): (1, 43.0)}
    # AND both were taken 597 s before NotBefore
    assert exported.points(NOT_BEFORE_MARGIN) == {
        (("action", "drain"),): (1, 597.0),
        (("action", "approve"),): (1, 597.0),
    }


@pytest.mark.parametrize(
    "traceparent",
    [
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
        "00-" + "a" * 100_000,
        12,
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ],
)
def test_a_trace_context_that_is_not_one_never_breaks_processing_with_telemetry_on(
    store: SqliteStore, exported: Exported, traceparent: object
) -> None:
    # GIVEN a report whose traceparent is not W3C's form
    clock, sent = FakeClock(NOW), RecordingSender()

    # WHEN it is processed with telemetry on
    outcome = process(report(reboot(), {TRACEPARENT: traceparent}), deps(store, sent, exported.telemetry, clock), NOW)

    # THEN it is acted on as without one, and its span roots the trace the functions started for it
    assert [taken.action.value for taken in outcome.actions] == ["drain", "approve"]
    (span,) = exported.spans.get_finished_spans()
    assert span.parent is None
    assert span.context is not None
    assert f"{span.context.trace_id:032x}" == outcome.trace_id
    assert {line.trace_id for line in store.query()} == {outcome.trace_id}


def test_a_failed_invocation_is_reported_failed_and_still_raises(store: SqliteStore, exported: Exported) -> None:
    clock, sent = FakeClock(NOW), RecordingSender()
    run = deps(store, sent, exported.telemetry, clock, balancer=FailingBalancer({"web": ("web-0",)}))

    with pytest.raises(RetryableError):
        process(report(reboot(), TRACE.attributes()), run, NOW)

    (span,) = exported.spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["error.type"] == "RetryableError"
    assert span.attributes["mbridge.result"] == FAILED


def test_an_exporter_that_fails_never_fails_the_invocation(store: SqliteStore) -> None:
    clock, sent = FakeClock(NOW), RecordingSender()

    outcome = process(report(reboot(), TRACE.attributes()), deps(store, sent, Broken(), clock), NOW)

    assert [taken.action.value for taken in outcome.actions] == ["drain", "approve"]


def test_the_core_hands_each_invocation_over_once_and_the_default_is_a_no_op(store: SqliteStore) -> None:
    clock, sent, told = FakeClock(NOW), RecordingSender(), Reports()
    run = deps(store, sent, told, clock)

    process(report(reboot(), TRACE.attributes()), run, NOW)
    process(b"not json", run, NOW)

    assert [(one.result, one.refusals) for one in told.reports] == [("processed", ()), ("malformed", ("malformed",))]
    first = told.reports[0]
    assert (first.parent_span_id, first.trace is not None and first.trace.trace_id) == (TRACE.span_id, TRACE.trace_id)
    # AND without a telemetry the invocation's is the no-op, which takes a report and does nothing
    default = Deps(
        store=store, balancer=FakeBalancer(), sender=sent, audit=store, policy=Policy(), monotonic=clock.monotonic
    )
    assert default.telemetry is NO_TELEMETRY
    assert isinstance(NO_TELEMETRY, NoTelemetry)
    NO_TELEMETRY.invocation(first)


# With telemetry off, an app builds its Deps and processes a report: no OpenTelemetry SDK, exporter
# or adapter is loaded. (google-cloud-pubsub, the GCP app's bus, loads OpenTelemetry's API itself.)
OFF_PROBE = """
import json, sys
from datetime import datetime, timezone
from types import SimpleNamespace
from functions.azure_app import wiring as azure
from functions.gcp_app import wiring as gcp
from functions.core.policy import Policy
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from tests.factories import azure_event
from wire.envelope import encode, envelope_for_event
from wire.identity import ReporterName
now = datetime(2026, 3, 1, tzinfo=timezone.utc)
before = {name for name in sys.modules if name.startswith("opentelemetry")}
off = SimpleNamespace(telemetry="off")
telemetry = azure.build_telemetry(off, credential=None)
assert telemetry is gcp.build_telemetry(off)
store = SqliteStore(":memory:")
deps = Deps(store=store, balancer=FakeBalancer({"web": ("web-0",)}), sender=RecordingSender(), audit=store,
            policy=Policy(), verifier=ReporterName(), monotonic=FakeClock(now).monotonic, telemetry=telemetry)
event = azure_event(reporter="web-0", resources=("web-0",))
process(encode(envelope_for_event(event, now)), deps, now)
print(json.dumps({"before": sorted(before), "after": sorted(name for name in sys.modules if name.startswith(
    ("opentelemetry", "azure.monitor", "functions.telemetry.otel")))}))
"""


def test_with_telemetry_off_nothing_of_opentelemetry_is_loaded() -> None:
    # A process of its own: this module loads the SDK for the other tests.
    run = subprocess.run([sys.executable, "-c", OFF_PROBE], capture_output=True, text=True, check=True, timeout=60)
    loaded = json.loads(run.stdout)
    # THEN processing loaded nothing more, and nothing but what the Pub/Sub client loads for itself
    assert loaded["after"] == loaded["before"]
    assert not [name for name in loaded["after"] if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))]
    assert "functions.telemetry.otel" not in loaded["after"]
    assert not [name for name in loaded["after"] if name.startswith("azure.monitor")]


def test_the_setting_takes_off_or_the_apps_own_exporter() -> None:
    assert telemetry_setting(None, AZURE_MONITOR) == OFF
    assert telemetry_setting(" Azure-Monitor ", AZURE_MONITOR) == AZURE_MONITOR
    assert telemetry_setting("gcp", GCP) == GCP
    with pytest.raises(ValueError, match="MBRIDGE_TELEMETRY must be off or azure-monitor"):
        telemetry_setting("gcp", AZURE_MONITOR)


class Pushed(MetricExporter):
    """A metric exporter that keeps the names of the metrics of each export it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.exports: list[set[str]] = []

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        names = {
            metric.name
            for resource in metrics_data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }
        self.exports.append(names)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


class Batched:
    """The adapter as the apps build it: a batch processor and a periodic reader, whose own schedules
    (an hour) never come within a test, so what is exported by then was flushed."""

    def __init__(self, clock: FakeClock, flush_seconds: float | None) -> None:
        self.spans, self.metrics = InMemorySpanExporter(), Pushed()
        self.telemetry = OtelTelemetry(
            BatchSpanProcessor(self.spans, schedule_delay_millis=HOUR_MILLIS),
            [PeriodicExportingMetricReader(self.metrics, export_interval_millis=HOUR_MILLIS)],
            cloud="gcp",
            flush_seconds=flush_seconds,
            monotonic=clock.monotonic,
        )


HOUR_MILLIS = 3_600_000


def test_with_a_flush_each_invocations_report_is_exported_by_the_time_it_returns(store: SqliteStore) -> None:
    # GIVEN the adapter flushing after each invocation, as the Cloud Function's is
    clock, sent = FakeClock(NOW), RecordingSender()
    batched = Batched(clock, flush_seconds=2.0)
    run = deps(store, sent, batched.telemetry, clock)
    try:
        # WHEN a report is processed (its drain takes 3 s of the clock)
        process(report(reboot(), TRACE.attributes()), run, clock.now())

        # THEN its span and its metrics were exported before process returned
        assert [span.name for span in batched.spans.get_finished_spans()] == [SPAN_NAME]
        assert len(batched.metrics.exports) == 1
        assert {ACTIONS, INVOCATION_DURATION, NOTICE_TO_ACTION} <= batched.metrics.exports[0]

        # AND the next message's span is exported at once, its metrics with the first flush
        # METRICS_FLUSH_GAP_SECONDS after the last one
        process(b"not json", run, clock.now())
        assert len(batched.spans.get_finished_spans()) == 2
        assert len(batched.metrics.exports) == 1
        clock.advance(METRICS_FLUSH_GAP_SECONDS)
        process(b"not json", run, clock.now())
        assert len(batched.spans.get_finished_spans()) == 3
        assert len(batched.metrics.exports) == 2
        assert REFUSALS in batched.metrics.exports[1]
    finally:
        batched.telemetry.shutdown()


def test_without_a_flush_the_batches_wait_for_their_schedule_or_the_shutdown(store: SqliteStore) -> None:
    # GIVEN the adapter without a flush, as the Azure app's is (its host keeps the export threads running)
    clock, sent = FakeClock(NOW), RecordingSender()
    batched = Batched(clock, flush_seconds=None)

    # WHEN a report is processed
    process(report(reboot(), TRACE.attributes()), deps(store, sent, batched.telemetry, clock), clock.now())

    # THEN nothing was exported on the invocation's time; the shutdown exports it
    assert batched.spans.get_finished_spans() == ()
    assert batched.metrics.exports == []
    batched.telemetry.shutdown()
    assert [span.name for span in batched.spans.get_finished_spans()] == [SPAN_NAME]
    assert ACTIONS in batched.metrics.exports[-1]


class StuckProcessor(SimpleSpanProcessor):
    """Exports as it ends spans, but its flush fails as `failure` says."""

    def __init__(self, exporter: InMemorySpanExporter, failure: str) -> None:
        super().__init__(exporter)
        self.failure = failure

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if self.failure == "raises":
            raise RuntimeError("the trace endpoint is unreachable")
        return False  # timed out


@pytest.mark.parametrize("failure", ["raises", "times out"])
def test_a_flush_that_fails_is_logged_and_never_fails_the_invocation(
    store: SqliteStore, caplog: pytest.LogCaptureFixture, failure: str
) -> None:
    clock, sent, spans = FakeClock(NOW), RecordingSender(), InMemorySpanExporter()
    telemetry = OtelTelemetry(
        StuckProcessor(spans, failure),
        [InMemoryMetricReader()],
        cloud="gcp",
        flush_seconds=1.0,
        monotonic=clock.monotonic,
    )
    try:
        outcome = process(report(reboot(), TRACE.attributes()), deps(store, sent, telemetry, clock), clock.now())
    finally:
        telemetry.shutdown()

    assert [taken.action.value for taken in outcome.actions] == ["drain", "approve"]
    assert [record.getMessage() for record in caplog.records if record.name == "mbridge.functions.telemetry"] == [
        "telemetry: spans not exported after the invocation"
        if failure == "raises"
        else "telemetry: spans not exported in time after the invocation"
    ]
