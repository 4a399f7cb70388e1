"""The Azure app's telemetry through the real Azure Monitor exporters, to a local ingestion endpoint.

GIVEN the app's own `build_telemetry` with MBRIDGE_TELEMETRY=azure-monitor, a connection string whose
      ingestion endpoint is a local HTTPS server (a certificate the test makes; the SDK trusts it through
      REQUESTS_CA_BUNDLE), and the app's credential (a static token)
WHEN  a traced report is processed and the app stops (the SDK exports what is left on shutdown)
THEN  what reaches the ingestion endpoint is what Application Insights would store: the invocation as a
      request of the maintenance's trace (operation id = the trace id, parent = the envelope's span), the
      counters as custom metrics, sent with the app's Entra ID token for Azure Monitor, never a key alone.

What Application Insights does with it beyond its ingestion API is not checked here (no Azure account).
"""

from __future__ import annotations

import gzip
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from functions.azure_app import settings as names
from functions.azure_app.settings import Settings
from functions.azure_app.wiring import build_telemetry
from functions.core.policy import Policy
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from functions.telemetry import AZURE_MONITOR
from functions.telemetry.otel import OtelTelemetry
from tests.contract.azure.test_load_balancer import TOKEN, StaticToken, _self_signed
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from tests.peers import free_port
from wire.envelope import encode, envelope_for_event
from wire.identity import ReporterName
from wire.model import EventKind, EventStatus
from wire.tracecontext import TraceContext

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
TRACE = TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01", "")
INSTRUMENTATION_KEY = "00000000-0000-4000-8000-000000000001"
SCOPES: list[tuple[str, ...]] = []


@dataclass
class Ingestion:
    """The local ingestion endpoint: every item posted to /v2.1/track, with the request's headers."""

    url: str
    items: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def of_type(self, base_type: str) -> list[dict[str, Any]]:
        return [item for item in self.items if item.get("data", {}).get("baseType") == base_type]


def _handler(ingestion: Ingestion) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            posted = json.loads(body)
            items = posted if isinstance(posted, list) else [posted]
            ingestion.paths.append(self.path)
            ingestion.authorizations.append(self.headers.get("Authorization"))
            ingestion.items.extend(items)
            answer = json.dumps({"itemsReceived": len(items), "itemsAccepted": len(items), "errors": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep the test output clean

    return Handler


class RecordingToken(StaticToken):
    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        SCOPES.append(scopes)
        return super().get_token(*scopes, **kwargs)


@pytest.fixture
def ingestion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ingestion]:
    cert_path, key_path = _self_signed(tmp_path)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert_path))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    # The SDK's reports about itself (statsbeat to Microsoft's endpoints, its own counts into the
    # component once a while and at exit): not ours to test, and they would outlive the endpoint.
    monkeypatch.setenv("APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL", "true")
    monkeypatch.setenv("APPLICATIONINSIGHTS_SDKSTATS_DISABLED", "true")
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), BaseHTTPRequestHandler)
    found = Ingestion(f"https://127.0.0.1:{server.server_address[1]}/")
    server.RequestHandlerClass = _handler(found)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()


def test_an_invocation_reaches_application_insights_as_a_request_of_its_trace_with_its_metrics(
    ingestion: Ingestion, tmp_path: Path
) -> None:
    # GIVEN the app's telemetry as the settings build it, pointed at the local ingestion endpoint
    settings = Settings.from_env(
        {
            names.EVENTS_TOPIC: "maintenance-events",
            names.EVENTS_SUBSCRIPTION: "functions",
            names.SERVICEBUS_NAMESPACE: "mybus.servicebus.windows.net",
            names.TABLE_ENDPOINT: "https://myaccount.table.core.windows.net",
            names.TRUST_SUBSCRIPTIONS: "00000000-0000-0000-0000-00000000abcd",
            names.TRUST_RESOURCE_GROUPS: "rg-web",
            names.TELEMETRY: AZURE_MONITOR,
            names.APPLICATIONINSIGHTS_CONNECTION_STRING: (
                f"InstrumentationKey={INSTRUMENTATION_KEY};IngestionEndpoint={ingestion.url}"
            ),
        }
    )
    telemetry = build_telemetry(settings, RecordingToken())
    store, clock, sent = SqliteStore(str(tmp_path / "state.db")), FakeClock(NOW), RecordingSender()
    deps = Deps(
        store=store,
        balancer=FakeBalancer({"web": ("web-0", "web-1")}),
        sender=sent,
        audit=store,
        policy=Policy(),
        verifier=ReporterName(),
        monotonic=clock.monotonic,
        telemetry=telemetry,
    )
    event = azure_event(
        kind=EventKind.REBOOT,
        status=EventStatus.SCHEDULED,
        reporter="web-0",
        resources=("web-0",),
        event_id="E-1",
        not_before=NOW + timedelta(minutes=10),
    )

    # WHEN a traced report of web-0's Reboot is processed, and the app stops
    process(encode(envelope_for_event(event, NOW - timedelta(seconds=40), TRACE.attributes())), deps, NOW)
    assert isinstance(telemetry, OtelTelemetry)
    telemetry.shutdown()
    store.close()

    # THEN the items went to the track API, each request with the app's token for Azure Monitor
    assert ingestion.paths
    assert all(path.startswith("/v2.1/track") for path in ingestion.paths)
    assert set(ingestion.authorizations) == {f"Bearer {TOKEN}"}
    assert SCOPES
    assert all(scopes == ("https://monitor.azure.com//.default",) for scopes in SCOPES)
    assert {item["iKey"] for item in ingestion.items} == {INSTRUMENTATION_KEY}
    # AND the invocation is one request of the maintenance's trace, under the envelope's span
    (request,) = ingestion.of_type("RequestData")
    assert request["data"]["baseData"]["name"] == "mbridge.process"
    assert request["tags"]["ai.operation.id"] == TRACE.trace_id
    assert request["tags"]["ai.operation.parentId"] == TRACE.span_id
    assert request["data"]["baseData"]["success"] is True
    # ... whose own id is the one the drain's and approval's commands for the event carry
    traces = [command.trace for command in sent.commands]
    assert traces
    assert all(trace is not None and trace.trace_id == TRACE.trace_id for trace in traces)
    assert {trace.span_id for trace in traces if trace is not None} == {request["data"]["baseData"]["id"]}
    # AND the counters arrive as custom metrics, one series per action: the drain and the approval
    points = [
        (metric["name"], item["data"]["baseData"].get("properties", {}), metric["value"])
        for item in ingestion.of_type("MetricData")
        for metric in item["data"]["baseData"]["metrics"]
    ]
    actions = {properties.get("action"): value for name, properties, value in points if name == "mbridge.actions"}
    assert actions == {"drain": 1, "approve": 1}
    assert any(name == "mbridge.invocation.duration" for name, _, _ in points)
    # AND the service's resource comes from the adapter's own provider, not the process's global one
    resource = [properties for name, properties, _ in points if name == "_OTELRESOURCE_"]
    assert resource
    assert resource[0].get("service.name") == "maintenance-bridge-functions"
