"""JSON log lines on stderr: one object per line, for journald, Cloud Logging and Azure Monitor.

What a line is about is in top-level keys, not only in its text, so a log store can be queried by
them (`jq 'select(.event_id == "…")'`, `jsonPayload.event_id`, KQL `parse_json`):

    LOGGER.info("approved %s", event_id, extra=logs.fields(event_id=event_id, vm=vm_name))

The field names (FIELDS) are the same in the agent and the functions; docs/operations.md lists them.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

# The field names and helpers are wire's: the functions log the same ones.
from wire.logfields import FIELDS as FIELDS
from wire.logfields import MAX_VALUE_CHARS as MAX_VALUE_CHARS
from wire.logfields import event_fields as event_fields
from wire.logfields import fields as fields
from wire.logfields import json_safe

# The keys every line has. A record attribute of the same name (logging allows `extra={"level": …}`)
# goes under "extra" instead of replacing one of them.
BASE_KEYS = frozenset({"time", "level", "severity", "logger", "message", "exception", "stack", "extra"})
# The attributes every LogRecord has (and the two Formatter adds): never copied as fields.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The attributes a log call added through `extra`, JSON-safe."""
    return {key: json_safe(value) for key, value in vars(record).items() if key not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            # Cloud Logging reads `severity` from JSON lines written to stdout/stderr.
            "severity": record.levelname,
            "logger": record.name,
            "message": _message(record),
        }
        clashing: dict[str, Any] = {}
        for key, value in record_fields(record).items():
            (clashing if key in BASE_KEYS else entry)[key] = value
        if clashing:
            entry["extra"] = clashing
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        try:
            return json.dumps(entry, allow_nan=False)
        except (TypeError, ValueError):  # not reachable through json_safe; a log line must never fail
            return json.dumps({key: str(value) for key, value in entry.items()})


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # arguments that do not match the format: keep both rather than lose the line
        return f"{record.msg!r} {record.args!r}"


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The SDKs log every retry at INFO; keep their warnings, not their chatter.
    for noisy in ("azure", "google", "urllib3", "grpc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
