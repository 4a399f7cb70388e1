"""The agent's spans, exported over OTLP/HTTP to a real local peer (--otlp-endpoint).

GIVEN web-0's agent on the embedded bus with --otlp-endpoint pointing at a small HTTP server that
      decodes OTLP/HTTP protobuf posts, and the local function host
WHEN  Azure schedules a reboot of web-0, the functions drain and approve it, and the agent POSTs
THEN  the spans the peer received are of the envelopes' trace: the detection is the root with the
      id the trace id gives it, each publish has the span id its envelope carries and the detection
      as parent, the command's span has the span its command carried as parent, and the approval
      POST is the command's child; the resource names the service, the cloud and the VM.
AND   with a collector that is not there, the agent publishes as before, stops in time, and says so
      in its log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from agent.traces import detection_span_id
from simulator import Simulator
from tests.agent_runner import AgentThread, settings_for
from tests.e2e.local_host import Deployment, commands_sent, running_host
from tests.waiting import wait_until
from wire.commands import decode_command
from wire.envelope import COMMAND_TYPE_PREFIX, decode
from wire.transports.local import LocalBus

SET = ["web-0", "web-1"]
EVENT_ID = "0C1B7E5A-3F2D-4E8B-9A61-7D5C2B8E4F10"


@dataclass(frozen=True)
class Received:
    """One span as the peer decoded it, with its resource's attributes."""

    resource: dict[str, str]
    span: Span

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_id(self) -> str:
        return self.span.parent_span_id.hex()

    def attribute(self, name: str) -> str:
        (value,) = [str(a.value.string_value) for a in self.span.attributes if a.key == name]
        return value


class OtlpPeer:
    """A local OTLP/HTTP receiver: takes protobuf posts to /v1/traces and keeps what they held."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.requests: list[tuple[str, str]] = []  # (path, content type)
        self._lock = threading.Lock()
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with peer._lock:
                    peer.requests.append((self.path, self.headers.get("Content-Type", "")))
                    for resource_spans in request.resource_spans:
                        resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                        for scope in resource_spans.scope_spans:
                            peer.spans.extend(Received(resource, span) for span in scope.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def named(self, name: str) -> list[Received]:
        with self._lock:
            return [span for span in self.spans if span.span.name == name]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def peer() -> Iterator[OtlpPeer]:
    receiver = OtlpPeer()
    yield receiver
    receiver.close()


def test_the_exported_spans_carry_the_ids_of_the_envelopes_and_the_command(
    tmp_path: Path, agent_thread: Callable[..., AgentThread], peer: OtlpPeer
) -> None:
    # GIVEN web-0's agent with --otlp-endpoint, on the embedded bus with the function host
    deployment = Deployment.make(tmp_path, SET)
    with Simulator(cloud="azure", vm_names=SET, speed=10) as sim:
        agent = agent_thread(replace(deployment.agent(sim.base_urls[0], "web-0"), otlp_endpoint=peer.url))
        with running_host(sim, deployment):
            # WHEN Azure schedules a reboot of web-0, and the functions have it approved
            requests.post(
                f"{sim.base_urls[0]}/_sim/events",
                json={"event_type": "Reboot", "resources": ["web-0"], "event_id": EVENT_ID},
                timeout=5,
            ).raise_for_status()
            wait_until(lambda: len(sim.approvals()) == 1, 20, "the approval POST")
            wait_until(lambda: _result_sent(deployment.bus_path), 20, "the approval's result on the bus")
        agent.halt()  # the agent's stop exports what is queued
    assert agent.exit_code == 0
    wait_until(lambda: bool(peer.named("mbridge.approve")), 20, "the approval's span at the peer")

    # THEN the envelopes carry one trace, each publish a span of its own
    envelopes = [decode(event.body) for event in LocalBus(deployment.bus_path).read_events(0)]
    carried = [str(e.extensions["traceparent"]).split("-") for e in envelopes]
    (trace_id,) = {trace for _, trace, _, _ in carried}
    envelope_spans = {span for _, _, span, _ in carried}
    # AND the peer got them over OTLP/HTTP protobuf
    assert {path for path, _ in peer.requests} == {"/v1/traces"}
    assert {kind for _, kind in peer.requests} == {"application/x-protobuf"}
    # AND the detection is the root of that trace, with the id the trace id gives it
    (detect,) = peer.named("mbridge.detect")
    assert (detect.trace_id, detect.span_id, detect.parent_id) == (trace_id, detection_span_id(trace_id), "")
    assert detect.attribute("mbridge.event_id") == EVENT_ID
    assert detect.span.kind == Span.SPAN_KIND_INTERNAL
    # AND each envelope the agent published (the events' and the command result's) is a publish
    # span with the envelope's span id, under the detection
    publishes = peer.named("mbridge.publish")
    assert {span.span_id for span in publishes} == envelope_spans
    assert {(span.trace_id, span.parent_id) for span in publishes} == {(trace_id, detect.span_id)}
    assert all(span.span.kind == Span.SPAN_KIND_PRODUCER for span in publishes)
    # AND carrying out the command is a span under the one the command carried (the functions' invocation)
    (body,) = commands_sent(deployment.bus_path)
    command = decode_command(body).command
    assert command.trace is not None
    (handled,) = peer.named("mbridge.command")
    assert (handled.trace_id, handled.parent_id) == (trace_id, command.trace.span_id)
    assert handled.attribute("mbridge.command_id") == command.command_id
    assert handled.attribute("mbridge.result") == "accepted"
    assert handled.span.kind == Span.SPAN_KIND_CONSUMER
    # AND the approval's POST to the metadata service is its child
    (approve,) = peer.named("mbridge.approve")
    assert (approve.trace_id, approve.parent_id) == (trace_id, handled.span_id)
    assert approve.span.kind == Span.SPAN_KIND_CLIENT
    assert approve.attribute("mbridge.event_id") == EVENT_ID
    # AND every span's resource names the service, the cloud and the VM
    resources = {tuple(sorted(span.resource.items())) for span in peer.spans}
    assert len(resources) == 1
    resource = peer.spans[0].resource
    assert resource["service.name"] == "maintenance-bridge-agent"
    assert (resource["cloud.provider"], resource["cloud.platform"]) == ("azure", "azure_vm")
    assert resource["host.name"] == resource["service.instance.id"] == "web-0"
    assert all(span.span.start_time_unix_nano <= span.span.end_time_unix_nano for span in peer.spans)


def test_with_no_collector_the_agent_goes_on_and_says_so(
    tmp_path: Path, agent_thread: Callable[..., AgentThread], caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN an agent whose collector is not there (a port nobody listens on)
    caplog.set_level(logging.INFO)
    closed = OtlpPeer()
    closed.close()
    with Simulator(cloud="azure", vm_names=["web-0"], speed=10) as sim:
        settings = settings_for("azure", sim.base_urls[0], "web-0", tmp_path / "web-0", otlp_endpoint=closed.url)
        agent = agent_thread(settings)
        # WHEN an event comes
        requests.post(
            f"{sim.base_urls[0]}/_sim/events", json={"event_type": "Reboot", "resources": ["web-0"]}, timeout=5
        ).raise_for_status()
        # THEN it is published as without spans
        agent.wait_for_count(1)
        # AND the agent stops within its bounds, the export's failure in its log
        began = time.monotonic()
        agent.halt()
    assert agent.exit_code == 0
    assert time.monotonic() - began < 30  # the outbox flush, then at most 3 s for the spans
    wait_until(
        lambda: any(r.name == "mbridge.agent.otel" and "span export:" in r.getMessage() for r in caplog.records),
        20,
        "the export's failure in the log",
    )


def _result_sent(bus_path: Path) -> bool:
    return any(decode(event.body).type.startswith(COMMAND_TYPE_PREFIX) for event in LocalBus(bus_path).read_events(0))
