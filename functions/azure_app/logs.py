"""Log lines of the Azure app that Azure Monitor can query by event, VM and command.

The Python worker of Azure Functions hands each record to the host through the handler it puts on
the root logger, and the host writes it to Application Insights (`traces`, or `AppTraces` in a
workspace) with the message text and its own customDimensions (category, invocation id, level).
Attributes passed through `extra` are not carried: the worker sends the formatted message only
(custom dimensions need an exporter of Azure Monitor's own, which would send every line a second
time, outside the invocation it belongs to).

So the message itself is the structured line: each record of this project (`mbridge.*`) is passed
to the host's handlers with its message replaced by one JSON object — `message`, `level`,
`logger`, the fields of functions.core.log_fields (`event_id`, `vm`, `command_id`, …) and, for an
exception, `exception`. A KQL query reads it with `parse_json(message)`
(docs/operations.md#logs). The host's category, invocation id and severity are kept, since the
record is handled by the very handlers it would have reached.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from typing import Any

from functions.core.log_fields import record_fields
from wire.bounds import bounded

ROOT_LOGGER = "mbridge"
# A traceback keeps its frames, but not an exception message of any size.
MAX_TRACEBACK = 16 * 1024
# How a process knows it runs in the Functions host: the Python worker is loaded (its module before
# Python 3.13, and from then on), or the host's runtime setting is there.
WORKER_MODULES = ("azure_functions_worker", "proxy_worker")
WORKER_RUNTIME_SETTING = "FUNCTIONS_WORKER_RUNTIME"


def structured(record: logging.LogRecord) -> dict[str, Any]:
    """The JSON object a record's message becomes."""
    entry: dict[str, Any] = {
        "message": bounded(record.getMessage()),
        "level": record.levelname.lower(),
        "logger": record.name,
    }
    entry.update(record_fields(record))
    if record.exc_info:
        trace = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        entry["exception"] = bounded(trace, MAX_TRACEBACK)
    return entry


class HostJsonHandler(logging.Handler):
    """Gives each record to the root logger's handlers (the Functions host's), its message the
    JSON object of `structured`. The traceback is in that object, so no handler appends it to
    the message as text after the JSON."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = json.dumps(structured(record), ensure_ascii=False, allow_nan=False, default=str)
            copy = logging.makeLogRecord(
                {**vars(record), "msg": line, "args": None, "exc_info": None, "exc_text": None}
            )
            for handler in logging.getLogger().handlers:
                if copy.levelno >= handler.level:
                    handler.handle(copy)
        except Exception:  # a log line must never fail the invocation
            self.handleError(record)


def in_functions_host() -> bool:
    return any(name in sys.modules for name in WORKER_MODULES) or bool(os.environ.get(WORKER_RUNTIME_SETTING))


def configure(logger_name: str = ROOT_LOGGER, *, force: bool = False) -> logging.Logger:
    """Send this project's records as JSON messages to the host, once per worker process.

    Only in the Functions host (or with `force`): called from the trigger, so the host's handlers
    are in place by then, while a process that merely calls the trigger (the tests, a local
    harness) keeps its logging as it was.
    """
    logger = logging.getLogger(logger_name)
    if not (force or in_functions_host()):
        return logger
    if not any(isinstance(handler, HostJsonHandler) for handler in logger.handlers):
        logger.addHandler(HostJsonHandler())
        logger.propagate = False
    return logger
