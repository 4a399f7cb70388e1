"""How a log record's structured fields become JSON in the function apps (Cloud Logging:
`jsonPayload` and labels; Azure: the JSON object in the message the Functions host records).

The field names and the helpers that fill `extra` are wire's (wire/logfields.py), shared with the
agent so that one query finds an event on the VM and in the functions.
"""

from __future__ import annotations

import logging
from typing import Any

from wire.logfields import FIELDS as FIELDS
from wire.logfields import MAX_VALUE_CHARS as MAX_VALUE_CHARS
from wire.logfields import event_fields as event_fields
from wire.logfields import fields as fields
from wire.logfields import json_safe as json_safe


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a log call passed, JSON-safe; other attributes are left alone."""
    return {name: json_safe(getattr(record, name)) for name in FIELDS if getattr(record, name, None) is not None}
