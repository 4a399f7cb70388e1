"""/healthz, /readyz and /metrics (Prometheus text format) on the agent's --listen address.

`/readyz` is how a health-probe load balancer drains the VM with no control-plane
permission at all: it turns unready on a `drain` command and ready again on `restore`
(docs/contracts.md#what-the-agent-checks). Without a command channel it is unready while an impactful event for
this VM is pending, so the load balancer drains the VM on its own.

Anyone who can reach --listen can connect, so the server is one thread around a selector:
a connection costs a buffer, never a thread, and each has a deadline, a size limit and a
place in a bounded table (ConnectionLimits; docs/agent.md, "Health and metrics").
"""

from __future__ import annotations

import json
import logging
import re
import selectors
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
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


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client of the health server can hold, and for how long (docs/agent.md)."""

    # Line and headers of each request, counted from the accept; also how long an answer may
    # wait for the client to take it, and for the client to close afterwards. Probes send
    # their whole request at once; 5 s leaves room for a few lost packets, no more.
    request_timeout: float = 5.0
    # Probes and scrapers need a handful at a time; a new connection beyond this closes the
    # oldest one, so a flood of idle sockets cannot lock the probe out.
    max_connections: int = 64
    # Request line and headers together: our requests are a few hundred bytes.
    max_request_head: int = 8192
    # The kernel's queue of connections not yet accepted.
    backlog: int = 128


Answer = tuple[int, bytes, str]  # status, body, content type
Route = Callable[[str], Answer]
DEFAULT_LIMITS = ConnectionLimits()

ACCEPT_RETRY_SECONDS = 1.0  # after accept() fails for want of descriptors
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")
_LISTENER = "listener"
_WAKEUP = "wakeup"


class _Connection:
    """One client: reading its request, writing the answer, then waiting for it to close."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.deadline = deadline
        self.received = bytearray()
        self.outgoing = memoryview(b"")
        self.phase = "reading"  # then "writing", then "draining"


class HealthServer:
    """Serves the three endpoints on one background thread, whatever the clients do."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        metrics: Metrics,
        readiness: Readiness,
        liveness: Callable[[], Mapping[str, object]],
        limits: ConnectionLimits = DEFAULT_LIMITS,
    ) -> None:
        self._route = _router(metrics, readiness, liveness)
        self._limits = limits
        self._listener = socket.create_server((host, port), backlog=limits.backlog)
        self._listener.setblocking(False)
        # stop() writes a byte here, so the loop can block without a timeout while idle
        self._wakeup, self._wakeup_writer = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wakeup, selectors.EVENT_READ, _WAKEUP)
        self._connections: dict[int, _Connection] = {}  # in accept order: the first is the oldest
        self._accept_paused_until: float | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="health", daemon=True)

    @property
    def address(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wakeup_writer.send(b"\0")
        if self._thread.ident is None:
            self._close_everything()
        else:
            self._thread.join()

    def _serve(self) -> None:
        try:
            while not self._stopping.is_set():
                events = self._selector.select(self._seconds_to_next_deadline())
                # clients before the listener: a connection accepted on the previous pass is
                # read before a new batch of accepts could push it out of the table
                for key, _ in sorted(events, key=lambda event: event[0].data == _LISTENER):
                    self._dispatch_safely(key.data)
                self._drop_overdue()
                self._resume_accepting_when_due()
        finally:
            self._close_everything()

    def _seconds_to_next_deadline(self) -> float | None:
        deadlines = [connection.deadline for connection in self._connections.values()]
        if self._accept_paused_until is not None:
            deadlines.append(self._accept_paused_until)
        if not deadlines:
            return None  # idle: block until a client or stop() wakes the loop
        return max(0.0, min(deadlines) - time.monotonic())

    def _dispatch_safely(self, tag: object) -> None:
        try:
            self._dispatch(tag)
        except Exception:  # one client must never stop the server the probe depends on
            LOGGER.exception("health: unexpected error serving a connection")
            if isinstance(tag, _Connection):
                self._close(tag)

    def _dispatch(self, tag: object) -> None:
        if tag == _WAKEUP:
            self._wakeup.recv(64)
        elif tag == _LISTENER:
            self._accept_batch()
        elif isinstance(tag, _Connection) and self._connections.get(tag.fd) is tag:
            if tag.phase == "writing":
                self._send_some(tag)
            else:
                self._receive(tag)

    def _accept_batch(self) -> None:
        # At most half the table per pass, so the connections of the previous pass stay in it
        # until they have been read.
        for _ in range(max(1, self._limits.max_connections // 2)):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # out of descriptors: the listener would stay readable
                self._pause_accepting(exc)
                return
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        if len(self._connections) >= self._limits.max_connections:
            self._close(next(iter(self._connections.values())))
        sock.setblocking(False)
        connection = _Connection(sock, time.monotonic() + self._limits.request_timeout)
        self._connections[connection.fd] = connection
        self._selector.register(sock, selectors.EVENT_READ, connection)
        self._receive(connection)  # a probe's request usually comes with its connection

    def _pause_accepting(self, error: OSError) -> None:
        LOGGER.warning("health: cannot accept connections (%s); trying again in %.0f s", error, ACCEPT_RETRY_SECONDS)
        self._selector.unregister(self._listener)
        self._accept_paused_until = time.monotonic() + ACCEPT_RETRY_SECONDS

    def _resume_accepting_when_due(self) -> None:
        if self._accept_paused_until is not None and time.monotonic() >= self._accept_paused_until:
            self._accept_paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)

    def _receive(self, connection: _Connection) -> None:
        try:
            chunk = connection.sock.recv(self._receive_size(connection))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(connection)
        elif connection.phase == "reading":
            self._take_request_bytes(connection, chunk)

    def _receive_size(self, connection: _Connection) -> int:
        if connection.phase == "draining":
            return 4096  # read to be thrown away
        return self._limits.max_request_head + 1 - len(connection.received)  # one byte past the limit at most

    def _take_request_bytes(self, connection: _Connection, chunk: bytes) -> None:
        searched = max(0, len(connection.received) - 3)
        connection.received += chunk
        end = _END_OF_HEAD.search(connection.received, searched)
        too_long = self._limits.max_request_head
        if (end is None and len(connection.received) > too_long) or (end is not None and end.end() > too_long):
            self._reply(connection, _json(431, {"error": f"request line and headers over {too_long} bytes"}))
        elif end is not None:
            self._reply(connection, self._answer(bytes(connection.received[: end.end()])))

    def _answer(self, head: bytes) -> Answer:
        words = head.split(b"\n", 1)[0].split()
        if len(words) != 3 or not words[2].startswith(b"HTTP/"):
            return _json(400, {"error": "bad request line"})
        if words[0] != b"GET":
            return _json(501, {"error": f"unsupported method {words[0].decode('latin-1')!r}"})
        path = words[1].decode("latin-1").split("?", 1)[0]
        try:
            return self._route(path)
        except Exception:
            LOGGER.exception("health: %s failed", path)
            return _json(500, {"error": "internal error"})

    def _reply(self, connection: _Connection, answer: Answer) -> None:
        connection.outgoing = memoryview(_response(*answer))
        connection.phase = "writing"
        connection.deadline = time.monotonic() + self._limits.request_timeout
        self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
        self._send_some(connection)

    def _send_some(self, connection: _Connection) -> None:
        try:
            sent = connection.sock.send(connection.outgoing)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(connection)
            return
        connection.outgoing = connection.outgoing[sent:]
        if not connection.outgoing:
            self._drain(connection)

    def _drain(self, connection: _Connection) -> None:
        """Half-close and read until the client closes: closing with its bytes unread would
        reset the connection and could destroy the answer before the client has read it."""
        try:
            connection.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(connection)
            return
        connection.phase = "draining"
        connection.deadline = time.monotonic() + self._limits.request_timeout
        self._selector.modify(connection.sock, selectors.EVENT_READ, connection)

    def _drop_overdue(self) -> None:
        now = time.monotonic()
        for connection in [c for c in self._connections.values() if c.deadline <= now]:
            self._close(connection)

    def _close(self, connection: _Connection) -> None:
        if self._connections.get(connection.fd) is not connection:
            return  # closed already; its descriptor may belong to a newer connection now
        del self._connections[connection.fd]
        self._selector.unregister(connection.sock)
        connection.sock.close()

    def _close_everything(self) -> None:
        for connection in list(self._connections.values()):
            self._close(connection)
        self._selector.close()
        for sock in (self._listener, self._wakeup, self._wakeup_writer):
            sock.close()


def _router(metrics: Metrics, readiness: Readiness, liveness: Callable[[], Mapping[str, object]]) -> Route:
    def route(path: str) -> Answer:
        if path == "/metrics":
            return 200, metrics.render().encode(), METRICS_CONTENT_TYPE
        if path == "/healthz":
            report = dict(liveness())
            return _json(200 if report.get("healthy") else 503, report)
        if path == "/readyz":
            ready, reason = readiness.status()
            return _json(200 if ready else 503, {"ready": ready, "reason": reason})
        return _json(404, {"error": "not found; try /healthz, /readyz or /metrics"})

    return route


def _json(status: int, body: Mapping[str, object]) -> Answer:
    return status, json.dumps(body, default=str).encode(), "application/json"


def _response(status: int, body: bytes, content_type: str) -> bytes:
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
