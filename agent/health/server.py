"""The health server: /healthz, /readyz and /metrics on the agent's --listen address.

Anyone who can reach --listen can connect, so the server is one thread around a selector:
a connection costs a buffer, never a thread, and each has a deadline, a size limit and a
place in a bounded table (ConnectionLimits; docs/agent.md, "Health and metrics").
"""

from __future__ import annotations

import contextlib
import logging
import re
import selectors
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from agent.health.endpoints import Answer, json_answer, response, router
from agent.health.eviction import peer_of, victim
from agent.health.metrics import Metrics
from agent.health.readiness import Readiness

LOGGER = logging.getLogger("mbridge.health")

DEFAULT_PORT = 9797


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client of the health server can hold, and for how long (docs/agent.md)."""

    # Line and headers of each request, counted from the accept; also how long an answer may
    # wait for the client to take it, and for the client to close afterwards. Probes send
    # their whole request at once; 5 s leaves room for a few lost packets, no more.
    request_timeout: float = 5.0
    # Probes and scrapers need a handful at a time; a new connection beyond this closes one of
    # the address holding the most (agent/health/eviction.py), so a flood of idle sockets from
    # another host can neither lock the probe out nor close it before its request arrives.
    max_connections: int = 64
    # Request line and headers together: our requests are a few hundred bytes.
    max_request_head: int = 8192
    # The kernel's queue of connections not yet accepted.
    backlog: int = 128


DEFAULT_LIMITS = ConnectionLimits()

ACCEPT_RETRY_SECONDS = 1.0  # after accept() fails for want of descriptors
LOOP_RETRY_SECONDS = 1.0  # after a pass of the loop failed unexpectedly
_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")
_LISTENER = "listener"
_WAKEUP = "wakeup"


class _Connection:
    """One client: reading its request, writing the answer, then waiting for it to close."""

    def __init__(self, sock: socket.socket, peer: str, deadline: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer  # the address it counts under when the table is full
        self.deadline = deadline
        self.received = bytearray()
        self.outgoing = memoryview(b"")
        self.phase = "reading"  # then "writing", then "draining"

    @property
    def answered(self) -> bool:
        """The whole answer is sent; the connection only waits for the client to close."""
        return self.phase == "draining"


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
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._route = router(metrics, readiness, liveness)
        self._limits = limits
        # Every deadline is read from this clock; a test freezes it to say exactly what is overdue.
        self._monotonic = monotonic
        self._listener = socket.create_server((host, port), backlog=limits.backlog)
        self._listener.setblocking(False)
        # stop() writes a byte here, so the loop can block without a timeout while idle
        self._wakeup, self._wakeup_writer = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wakeup, selectors.EVENT_READ, _WAKEUP)
        self._connections: dict[int, _Connection] = {}  # in accept order: the first is the oldest
        self._held_per_peer: dict[str, int] = {}
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
        with contextlib.suppress(OSError):  # the loop ended already and closed its sockets
            self._wakeup_writer.send(b"\0")
        if self._thread.ident is None:
            self._close_everything()
        else:
            self._thread.join()

    def _serve(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    self._serve_once()
                except Exception:
                    # The endpoints are what the probes and the alerts read: a fault in one pass must
                    # not end them for the agent's lifetime.
                    LOGGER.exception("the health server's loop failed; carrying on in %.0f s", LOOP_RETRY_SECONDS)
                    self._stopping.wait(LOOP_RETRY_SECONDS)
        finally:
            self._close_everything()

    def _serve_once(self) -> None:
        events = self._selector.select(self._seconds_to_next_deadline())
        # clients before the listener: a connection accepted on the previous pass is
        # read before a new batch of accepts could push it out of the table
        for key, _ in sorted(events, key=lambda event: event[0].data == _LISTENER):
            self._dispatch_safely(key.data)
        self._drop_overdue()
        self._resume_accepting_when_due()

    def _seconds_to_next_deadline(self) -> float | None:
        deadlines = [connection.deadline for connection in self._connections.values()]
        if self._accept_paused_until is not None:
            deadlines.append(self._accept_paused_until)
        if not deadlines:
            return None  # idle: block until a client or stop() wakes the loop
        return max(0.0, min(deadlines) - self._monotonic())

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
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # out of descriptors: the listener would stay readable
                self._pause_accepting(exc)
                return
            self._admit(sock, peer_of(address))

    def _admit(self, sock: socket.socket, peer: str) -> None:
        if len(self._connections) >= self._limits.max_connections:
            self._close(victim(self._connections.values(), self._held_per_peer, peer))
        sock.setblocking(False)
        connection = _Connection(sock, peer, self._monotonic() + self._limits.request_timeout)
        self._connections[connection.fd] = connection
        self._held_per_peer[peer] = self._held_per_peer.get(peer, 0) + 1
        self._selector.register(sock, selectors.EVENT_READ, connection)
        self._receive(connection)  # a probe's request usually comes with its connection

    def _pause_accepting(self, error: OSError) -> None:
        LOGGER.warning("health: cannot accept connections (%s); trying again in %.0f s", error, ACCEPT_RETRY_SECONDS)
        self._selector.unregister(self._listener)
        self._accept_paused_until = self._monotonic() + ACCEPT_RETRY_SECONDS

    def _resume_accepting_when_due(self) -> None:
        if self._accept_paused_until is not None and self._monotonic() >= self._accept_paused_until:
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
            self._reply(connection, json_answer(431, {"error": f"request line and headers over {too_long} bytes"}))
        elif end is not None:
            self._reply(connection, self._answer(bytes(connection.received[: end.end()])))

    def _answer(self, head: bytes) -> Answer:
        words = head.split(b"\n", 1)[0].split()
        if len(words) != 3 or not words[2].startswith(b"HTTP/"):
            return json_answer(400, {"error": "bad request line"})
        if words[0] != b"GET":
            return json_answer(501, {"error": f"unsupported method {words[0].decode('latin-1')!r}"})
        path = words[1].decode("latin-1").split("?", 1)[0]
        try:
            return self._route(path)
        except Exception:
            LOGGER.exception("health: %s failed", path)
            return json_answer(500, {"error": "internal error"})

    def _reply(self, connection: _Connection, answer: Answer) -> None:
        connection.outgoing = memoryview(response(*answer))
        connection.phase = "writing"
        connection.deadline = self._monotonic() + self._limits.request_timeout
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
        connection.deadline = self._monotonic() + self._limits.request_timeout
        self._selector.modify(connection.sock, selectors.EVENT_READ, connection)

    def _drop_overdue(self) -> None:
        now = self._monotonic()
        for connection in [c for c in self._connections.values() if c.deadline <= now]:
            self._close(connection)

    def _close(self, connection: _Connection) -> None:
        if self._connections.get(connection.fd) is not connection:
            return  # closed already; its descriptor may belong to a newer connection now
        del self._connections[connection.fd]
        left = self._held_per_peer.pop(connection.peer) - 1
        if left:
            self._held_per_peer[connection.peer] = left
        self._selector.unregister(connection.sock)
        connection.sock.close()

    def _close_everything(self) -> None:
        for connection in list(self._connections.values()):
            self._close(connection)
        self._selector.close()
        for sock in (self._listener, self._wakeup, self._wakeup_writer):
            sock.close()
