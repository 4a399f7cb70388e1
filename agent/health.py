"""/healthz, /readyz and /metrics (Prometheus text format) on the agent's --listen address.

`/readyz` is how a health-probe load balancer drains the VM with no control-plane
permission at all: it turns unready on a `drain` command and ready again on `restore`
(design §3.3). Without a command channel it is unready while an impactful event for
this VM is pending, so the load balancer drains the VM on its own.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

LOGGER = logging.getLogger("mbridge.health")

DEFAULT_PORT = 9797
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    def __init__(self, buckets: Sequence[float] = LAG_BUCKETS) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += 1
        self.total += value
        self.count += 1


class Metrics:
    """The agent's counters, gauges and histograms. Thread-safe; rendered on demand."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._histograms: dict[str, Histogram] = {}
        self._gauges: dict[str, Callable[[], float | None]] = {}
        self._help: dict[str, tuple[str, str]] = {}

    def describe(self, name: str, kind: str, text: str) -> None:
        self._help[name] = (kind, text)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + amount

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            self._histograms.setdefault(name, Histogram()).observe(value)

    def gauge(self, name: str, read: Callable[[], float | None]) -> None:
        """A value read when /metrics is scraped (None: not known yet, not exported)."""
        self._gauges[name] = read

    def value(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._counters.get((name, tuple(sorted(labels.items()))), 0.0)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            counters = dict(self._counters)
            histograms = {name: (h.buckets, list(h.counts), h.total, h.count) for name, h in self._histograms.items()}
        names = sorted({name for name, _ in counters} | set(histograms) | set(self._gauges) | set(self._help))
        for name in names:
            kind, text = self._help.get(name, ("untyped", name))
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            for (metric, labels), amount in sorted(counters.items()):
                if metric == name:
                    lines.append(f"{name}{_labels(labels)} {_number(amount)}")
            if name in histograms:
                buckets, counts, total, count = histograms[name]
                for bound, amount in zip(buckets, counts):
                    lines.append(f'{name}_bucket{{le="{_number(bound)}"}} {amount}')
                lines.append(f'{name}_bucket{{le="+Inf"}} {count}')
                lines.append(f"{name}_sum {_number(total)}")
                lines.append(f"{name}_count {count}")
            if name in self._gauges:
                reading = self._gauges[name]()
                if reading is not None:
                    lines.append(f"{name} {_number(reading)}")
        return "\n".join(lines) + "\n"


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))


class Readiness:
    """Whether the load balancer should send traffic to this VM, and why not.

    With a command channel, `drain`/`restore` commands decide. Without one, a pending
    impactful event for this VM decides. `persist` saves the drained flag, so a restart
    in the middle of maintenance does not readmit the VM.
    """

    def __init__(
        self,
        *,
        follows_commands: bool,
        drained: bool = False,
        reason: str = "",
        persist: Callable[[bool, str], None] = lambda drained, reason: None,
    ) -> None:
        self._follows_commands = follows_commands
        self._drained = drained
        self._drain_reason = reason
        self._pending_impact: str | None = None
        self._persist = persist
        self._lock = threading.Lock()

    def set_drained(self, drained: bool, reason: str) -> None:
        with self._lock:
            self._drained = drained
            self._drain_reason = reason
        self._persist(drained, reason)
        LOGGER.info("readiness: %s (%s)", "drained" if drained else "restored", reason)

    def set_pending_impact(self, reason: str | None) -> None:
        with self._lock:
            self._pending_impact = reason

    def status(self) -> tuple[bool, str]:
        with self._lock:
            if self._follows_commands:
                return (not self._drained, self._drain_reason or ("drained" if self._drained else "ready"))
            if self._pending_impact:
                return False, self._pending_impact
            return True, "no impactful event pending for this VM"


class HealthServer:
    """Serves the three endpoints on a background thread."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        metrics: Metrics,
        readiness: Readiness,
        liveness: Callable[[], Mapping[str, object]],
    ) -> None:
        handler = _handler(metrics, readiness, liveness)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="health", daemon=True)

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(
    metrics: Metrics, readiness: Readiness, liveness: Callable[[], Mapping[str, object]]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "mbridge-agent"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/healthz":
                report = dict(liveness())
                self._json(200 if report.get("healthy") else 503, report)
            elif path == "/readyz":
                ready, reason = readiness.status()
                self._json(200 if ready else 503, {"ready": ready, "reason": reason})
            else:
                self._json(404, {"error": "not found; try /healthz, /readyz or /metrics"})

        def log_message(self, format: str, *args: object) -> None:
            return  # probes every few seconds would drown the agent's own log

        def _json(self, status: int, body: Mapping[str, object]) -> None:
            self._send(status, json.dumps(body, default=str).encode(), "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler
