"""Structured log lines for Cloud Logging: one JSON object per line on stdout.

Cloud Functions (gen2) and Cloud Run turn each JSON line into a log entry and lift the special
fields out of it: `severity`, `message`, `time`, `logging.googleapis.com/labels` (string values
only; indexed, so a query such as `labels.event_id="..."` finds every line of one event) and
`logging.googleapis.com/sourceLocation`. Other keys stay in `jsonPayload`.

Callers attach labels and payload through `extra`:

    LOG.info("processed", extra={"labels": {"event_id": ...}, "payload": {"actions": [...]}})

The structured fields of functions.core.log_fields (`event_id`, `vm`, `command_id`, … passed as
`extra`, as the function core does) become both top-level keys of the line (`jsonPayload.event_id`,
as in the agent's lines) and labels (`labels.event_id`, indexed).

A line with a `trace_id` (a field or a label: every line about a maintenance) also carries
`logging.googleapis.com/trace` = `projects/<project>/traces/<trace id>`, the project being the
function's own (`MBRIDGE_GCP_PROJECT`, else `GOOGLE_CLOUD_PROJECT`: where the telemetry exporter
writes the trace too): Cloud Logging files the entry under that trace, and Cloud Trace shows it
beside the trace's spans. No `logging.googleapis.com/spanId`: a line knows the maintenance's trace,
not the span of the invocation that logs it (that span is the telemetry exporter's).

An exception's traceback goes into `message`, where Error Reporting finds it.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from functions.core.log_fields import record_fields
from wire.bounds import bounded
from wire.tracecontext import is_trace_id

ROOT_LOGGER = "mbridge"
# A traceback keeps its frames, but not an exception message of any size (a log entry holds 256 KiB).
MAX_TRACEBACK = 16 * 1024
LABELS_KEY = "logging.googleapis.com/labels"
SOURCE_KEY = "logging.googleapis.com/sourceLocation"
TRACE_KEY = "logging.googleapis.com/trace"
_SEVERITY = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARNING",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "CRITICAL",
}


def severity(levelno: int) -> str:
    """Cloud Logging's name for a logging level (levels in between round down)."""
    for level in sorted(_SEVERITY, reverse=True):
        if levelno >= level:
            return _SEVERITY[level]
    return "DEFAULT"


def structured(record: logging.LogRecord, project: str | None = None) -> dict[str, Any]:
    """The JSON object of one log record; with `project`, a line of a trace names it as Cloud Logging
    links it (`TRACE_KEY`)."""
    message = bounded(record.getMessage())
    if record.exc_info:
        trace = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        message = f"{message}\n{bounded(trace, MAX_TRACEBACK)}"
    labels: dict[str, str] = {"logger": record.name}
    extra_labels = getattr(record, "labels", None)
    if isinstance(extra_labels, Mapping):
        labels.update({str(key): str(value) for key, value in extra_labels.items() if value is not None})
    entry: dict[str, Any] = {}
    payload = getattr(record, "payload", None)
    if isinstance(payload, Mapping):
        entry.update(payload)
    structured_fields = record_fields(record)
    entry.update(structured_fields)
    labels.update({key: str(value) for key, value in structured_fields.items() if key not in labels})
    entry.update(
        {
            "severity": severity(record.levelno),
            "message": message,
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat().replace("+00:00", "Z"),
            LABELS_KEY: labels,
            SOURCE_KEY: {"file": record.pathname, "line": str(record.lineno), "function": record.funcName},
        }
    )
    trace_id = structured_fields.get("trace_id") or labels.get("trace_id")  # the outcome line's is a label
    if project and is_trace_id(trace_id):
        entry[TRACE_KEY] = f"projects/{project}/traces/{trace_id}"
    return entry


class StructuredHandler(logging.Handler):
    """Writes `structured(record)` as one line to the current sys.stdout.

    The stream is looked up at every write rather than kept: test runners and the functions
    framework may swap sys.stdout after this handler is installed.
    """

    def __init__(self, project: str | None = None) -> None:
        super().__init__()
        self.project = project

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = json.dumps(structured(record, self.project), ensure_ascii=False, default=str)
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except Exception:  # a log line must never fail the invocation
            self.handleError(record)


def configure(level: str = "INFO", logger_name: str = ROOT_LOGGER, project: str | None = None) -> logging.Logger:
    """Send this project's records (`mbridge.*`) as structured lines, once per process; a later
    call only changes the level and the Google Cloud project the lines' traces are of (None: lines
    name no trace).

    Only our namespace is configured, and it stops propagating: the functions framework may
    configure the root logger itself (plain lines, execution ids), and each record must appear
    once. Library loggers keep the root configuration.
    """
    logger = logging.getLogger(logger_name)
    handlers = [handler for handler in logger.handlers if isinstance(handler, StructuredHandler)]
    if not handlers:
        logger.addHandler(StructuredHandler(project))
    for handler in handlers:
        handler.project = project
    logger.setLevel(level)
    logger.propagate = False
    return logger
