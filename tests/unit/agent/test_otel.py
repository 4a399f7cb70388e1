"""The agent's spans (agent/otel.py) on the SDK's in-memory exporter.

GIVEN the agent's span export with the SDK's in-memory exporter and a manual clock
WHEN  a maintenance is detected, its envelopes published, a command carried out (an approval POSTed)
THEN  the detection is the root of the envelopes' trace with the id the trace id gives it, each publish
      has its envelope's span id under the detection, the command's span is under the span the command
      carried and the POST under it, at the clock's times; a command or a POST that fails still raises
      as without spans, its span marked failed; what cannot be recorded is never raised; and the
      library's log lines reach the agent's log once per REPORT_EVERY_SECONDS at most.
(Needs the agent-otel extra: left out of the 3.9 run, as the OpenTelemetry tests of the functions are.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agent.commands.ports import CommandRetryableError
from agent.messages import event_message
from agent.otel import APPROVE, COMMAND, DETECT, PUBLISH, SERVICE_NAME, OtlpSpans
from agent.sources.azure.document import ScheduledEventsDocument
from agent.sources.http import MetadataUnavailableError
from agent.traces import detection_span_id
from tests.factories import azure_event
from tests.kit import FakeClock
from tests.unit.agent.test_otlp_endpoint import loaded_by_an_agent
from wire.commands import Command, CommandType
from wire.model import Cloud, CommandResult
from wire.tracecontext import TraceContext

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
TRACE = TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
# The functions' invocation that sent the command: its own span of the same trace.
SENT = TraceContext(TRACE.trace_id, "b7ad6b7169203331", "01", "rojo=00f067aa0ba902b7")


class Exported:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.clock = FakeClock(NOW)
        self.spans = OtlpSpans(
            SimpleSpanProcessor(self.exporter), cloud=Cloud.AZURE, vm_name="web-0", clock=self.clock, report_every=60
        )

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]


@pytest.fixture
def exported() -> Iterator[Exported]:
    made = Exported()
    yield made
    made.spans.close()


def _hex(number: int, width: int) -> str:
    return f"{number:0{width}x}"


def _command(trace: TraceContext | None = SENT) -> Command:
    return Command(
        command_id="cmd-1",
        type=CommandType.APPROVE,
        event_id="E1",
        target="web-0",
        issued_at=NOW,
        expires_at=NOW + timedelta(minutes=5),
        trace=trace,
    )


class FakeApprover:
    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.posted: list[str] = []

    def fetch_document(self) -> ScheduledEventsDocument:
        raise NotImplementedError

    def post_approval(self, event_id: str) -> None:
        self.posted.append(event_id)
        if self.fails:
            raise MetadataUnavailableError("connection", "connection refused")


def test_detection_and_publishes_are_spans_of_the_envelopes_trace_with_their_ids(exported: Exported) -> None:
    event = azure_event(reporter="web-0", resources=("web-0",))
    observed = NOW - timedelta(seconds=2)
    # WHEN the event's trace starts, its envelope is recorded and then published
    exported.spans.detected(event, TRACE, observed, NOW)
    message = event_message(event, observed, TRACE)
    exported.spans.published(message, observed, NOW + timedelta(seconds=1))
    # THEN the detection is the root, its id the one the trace id gives it
    (detect,) = exported.named(DETECT)
    assert detect.context is not None
    assert (_hex(detect.context.trace_id, 32), _hex(detect.context.span_id, 16)) == (
        TRACE.trace_id,
        detection_span_id(TRACE.trace_id),
    )
    assert detect.parent is None
    assert detect.kind is SpanKind.INTERNAL
    assert (detect.start_time, detect.end_time) == (_nanos(observed), _nanos(NOW))
    assert detect.attributes is not None
    assert detect.attributes["mbridge.event_id"] == event.event_id
    # AND the publish has the envelope's span id, under the detection
    (publish,) = exported.named(PUBLISH)
    assert publish.context is not None
    assert publish.parent is not None
    assert (_hex(publish.context.trace_id, 32), _hex(publish.context.span_id, 16)) == (TRACE.trace_id, TRACE.span_id)
    assert _hex(publish.parent.span_id, 16) == detection_span_id(TRACE.trace_id)
    assert publish.kind is SpanKind.PRODUCER
    assert (publish.start_time, publish.end_time) == (_nanos(observed), _nanos(NOW + timedelta(seconds=1)))
    assert publish.attributes is not None
    assert publish.attributes["mbridge.envelope_id"] == message.envelope_id
    # AND the resource names the service, the cloud and the VM
    attributes = dict(publish.resource.attributes)
    assert (attributes["service.name"], attributes["cloud.provider"], attributes["host.name"]) == (
        SERVICE_NAME,
        "azure",
        "web-0",
    )


def test_a_command_is_a_span_under_the_one_it_carried_and_its_post_a_child(exported: Exported) -> None:
    approver = FakeApprover()
    traced = exported.spans.approver(approver)
    # WHEN a command is carried out, posting an approval a second in
    with exported.spans.command(_command()) as done:
        exported.clock.advance(1)
        traced.post_approval("E1")
        exported.clock.advance(1)
        done(CommandResult(command_id="cmd-1", accepted=True, event_id="E1", target="web-0", reason="approved"))
    # THEN the POST reached the approver, and the spans say who sent what
    assert approver.posted == ["E1"]
    (command,) = exported.named(COMMAND)
    assert command.parent is not None
    assert command.context is not None
    assert (_hex(command.parent.trace_id, 32), _hex(command.parent.span_id, 16)) == (SENT.trace_id, SENT.span_id)
    assert _hex(command.context.trace_id, 32) == SENT.trace_id
    assert command.context.trace_state.get("rojo") == "00f067aa0ba902b7"  # passed on untouched
    assert command.kind is SpanKind.CONSUMER
    assert (command.start_time, command.end_time) == (_nanos(NOW), _nanos(NOW + timedelta(seconds=2)))
    assert command.attributes is not None
    assert (command.attributes["mbridge.result"], command.attributes["mbridge.command_type"]) == ("accepted", "approve")
    (post,) = exported.named(APPROVE)
    assert post.parent is not None
    assert post.parent.span_id == command.context.span_id
    assert post.kind is SpanKind.CLIENT
    assert post.start_time == _nanos(NOW + timedelta(seconds=1))


def test_a_command_without_a_trace_is_a_root_span(exported: Exported) -> None:
    with exported.spans.command(_command(trace=None)):
        pass
    (command,) = exported.named(COMMAND)
    assert command.parent is None


def test_what_fails_in_a_command_or_its_post_raises_as_without_spans_and_marks_the_span(exported: Exported) -> None:
    traced = exported.spans.approver(FakeApprover(fails=True))

    def carry_out() -> None:
        with exported.spans.command(_command()):
            try:
                traced.post_approval("E1")
            except MetadataUnavailableError as exc:
                raise CommandRetryableError("IMDS unavailable") from exc

    with pytest.raises(CommandRetryableError):
        carry_out()
    (post,) = exported.named(APPROVE)
    (command,) = exported.named(COMMAND)
    assert post.status.status_code is StatusCode.ERROR
    assert post.attributes is not None
    assert post.attributes["error.type"] == "MetadataUnavailableError"
    assert command.status.status_code is StatusCode.ERROR
    assert command.attributes is not None
    assert command.attributes["error.type"] == "CommandRetryableError"


def test_what_cannot_be_a_span_is_logged_never_raised(exported: Exported, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    message = event_message(azure_event(reporter="web-0"), NOW, TRACE)
    # an envelope whose body is not JSON (never written by the agent): no span, no exception
    exported.spans.published(replace(message, body=b"\xff"), NOW, NOW)
    # a trace id that is not hex (nor ever one the agent writes): logged, not raised
    exported.spans.detected(azure_event(reporter="web-0"), TraceContext("not-hex" * 5, "x" * 16), NOW, NOW)
    assert exported.exporter.get_finished_spans() == ()
    (logged,) = [r.getMessage() for r in caplog.records if r.name == "mbridge.agent.otel"]
    assert logged.startswith("span export: detection span not recorded")


def test_the_librarys_log_lines_reach_the_agents_log_once_per_period(
    exported: Exported, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    library = logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter")

    def relayed() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "mbridge.agent.otel"]

    # WHEN the exporter fails three times within a period, then once after it
    for _ in range(3):
        library.warning("Transient error %s encountered while exporting span batch", "connection refused")
    assert len(relayed()) == 1
    exported.clock.advance(60)
    library.error("Failed to export span batch code: %s", 503)
    # THEN the agent's log has the first, and the next with the count of those left out
    first, second = relayed()
    assert "connection refused" in first
    assert "Failed to export span batch code: 503" in second
    assert "(2 more such line(s) left out before it)" in second
    # AND the library's lines go to the agent's handlers only that way while the export is on, and as
    # before once it closed
    assert not logging.getLogger("opentelemetry").propagate
    exported.spans.close()
    assert logging.getLogger("opentelemetry").propagate


def test_with_it_on_the_agent_loads_the_sdk_and_the_exporter(tmp_path: Path) -> None:
    # (the counterpart of test_otlp_endpoint's probe with it off: the probe does see them)
    loaded = loaded_by_an_agent(tmp_path / "web-0", "http://127.0.0.1:9")
    assert {"agent.otel", "opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http"} <= set(loaded)


def _nanos(moment: datetime) -> int:
    return int((moment - datetime(1970, 1, 1, tzinfo=timezone.utc)) / timedelta(microseconds=1)) * 1000
