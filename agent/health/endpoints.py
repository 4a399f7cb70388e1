"""What each endpoint answers, and the bytes of an HTTP answer.

Kept apart from the server, which only moves bytes: this is the part that knows the paths.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Callable

from agent.health.metrics import Metrics
from agent.health.readiness import Readiness
from wire.version import version

Answer = tuple[int, bytes, str]  # status, body, content type
Route = Callable[[str], Answer]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def router(metrics: Metrics, readiness: Readiness, liveness: Callable[[], Mapping[str, object]]) -> Route:
    def route(path: str) -> Answer:
        if path == "/metrics":
            return 200, metrics.render().encode(), METRICS_CONTENT_TYPE
        if path == "/healthz":
            # The release with every answer: a fleet's probes then say which VMs run which.
            report = {**liveness(), "version": version()}
            return json_answer(200 if report.get("healthy") else 503, report)
        if path == "/readyz":
            ready, reason = readiness.status()
            return json_answer(200 if ready else 503, {"ready": ready, "reason": reason})
        return json_answer(404, {"error": "not found; try /healthz, /readyz or /metrics"})

    return route


def json_answer(status: int, body: Mapping[str, object]) -> Answer:
    return status, json.dumps(body, default=str).encode(), "application/json"


def response(status: int, body: bytes, content_type: str) -> bytes:
    """HTTP/1.0 and one answer per connection, as the endpoints always answered."""
    head = (
        f"HTTP/1.0 {status} {HTTPStatus(status).phrase}\r\n"
        "Server: mbridge-agent\r\n"
        f"Date: {formatdate(usegmt=True)}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
