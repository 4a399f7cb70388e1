"""MBRIDGE_TELEMETRY: whether the function apps export each invocation as an OpenTelemetry span
and metrics, and where to (docs/operations.md#telemetry).

Nothing here imports OpenTelemetry: the default, `off`, loads none of it. An app that names an
exporter builds it (the exporter's module is the app's own import, so each app's requirements
name only its own cloud's) and hands it to `exporting`, which loads the adapter (otel.py).
"""

from __future__ import annotations

import sys
from typing import Any

from functions.core.telemetry import Telemetry

TELEMETRY = "MBRIDGE_TELEMETRY"
OFF = "off"
AZURE_MONITOR = "azure-monitor"  # Application Insights (APPLICATIONINSIGHTS_CONNECTION_STRING)
GCP = "gcp"  # Cloud Trace and Cloud Monitoring
# Metrics are exported once a minute: what Application Insights and Cloud Monitoring aggregate by.
METRICS_INTERVAL_MILLIS = 60_000
# How long an app that flushes after each invocation (`exporting(flush=True)`) waits for the export
# at most: the invocation is done, but its answer to the platform waits for it.
FLUSH_SECONDS = 5.0


def telemetry_setting(value: str | None, exporter: str) -> str:
    """The setting's value (`off` when unset) for an app whose cloud's exporter is `exporter`.

    Raises:
        ValueError: anything but `off` or `exporter`; the message names the setting.
    """
    chosen = (value or "").strip().lower() or OFF
    if chosen not in (OFF, exporter):
        raise ValueError(f"{TELEMETRY} must be {OFF} or {exporter}, not {chosen[:40]!r}")
    return chosen


def exporting(spans: Any, metrics: Any, *, cloud: str, flush: bool = False) -> Telemetry:
    """Invocations as spans through `spans` (a SpanExporter, or a function of the adapter's own
    TracerProvider that makes one: Azure Monitor's exporter reads the service's resource from the
    provider it is given, and without one reads the global provider, which is not ours), in batches
    from a thread of the SDK's, and metrics through `metrics` (a MetricExporter) once a minute. With
    `flush`, what an invocation reported is also exported before it returns, waiting at most
    FLUSH_SECONDS (an app whose CPU may be throttled between requests: functions/telemetry/otel.py);
    without, an invocation never waits on the network. (Typed Any, and the version checked: the
    settings, which the 3.9 type check reads, import this module, and OpenTelemetry's own modules
    take 3.10 and newer.)"""
    if sys.version_info >= (3, 10):
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from functions.telemetry.otel import OtelTelemetry

        reader = PeriodicExportingMetricReader(metrics, export_interval_millis=METRICS_INTERVAL_MILLIS)
        telemetry = OtelTelemetry(None, [reader], cloud=cloud, flush_seconds=FLUSH_SECONDS if flush else None)
        exporter = spans if hasattr(spans, "export") else spans(telemetry.tracer_provider)
        telemetry.tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        return telemetry
    raise RuntimeError("OpenTelemetry's SDK takes Python 3.10 or newer; the function apps run on 3.11")
