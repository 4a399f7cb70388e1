"""The HTTP side of the simulator: one ThreadingHTTPServer per VM on consecutive ports, its request
handler, and the binding of a run of ports.

Kept apart from `Simulator` (server.py), which wires the state and the APIs: this module knows
HTTP/1.1, keep-alive and sockets, and hands every request to the router.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from simulator.store import MetadataRequest, Response

if TYPE_CHECKING:
    from simulator.routing import Router

_MAX_BODY = 1 << 20
_PORT_ATTEMPTS = 50


class VmServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # long-polls must not hold up stop()

    def __init__(self, address: tuple[str, int], vm: str) -> None:
        self.vm = vm
        self.router: Router | None = None
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def track(self, connection: socket.socket, open_now: bool) -> None:
        with self._connections_lock:
            if open_now:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close_for_good(self) -> None:
        """Refuse new connections and cut the open ones (kept-alive clients, pending long-polls)."""
        self.shutdown()
        self.server_close()
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):  # already closed by its client
                connection.shutdown(socket.SHUT_RDWR)


class VmServer6(VmServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: VmServer
    server_version = "maintenance-bridge-simulator"
    # Both metadata services speak HTTP/1.1 with keep-alive; clients that reuse connections
    # (requests.Session) must behave here as they will on a VM. Every answer has a Content-Length.
    protocol_version = "HTTP/1.1"
    # An answer is written as headers, then body: with Nagle's algorithm on, the body waits for the
    # client's delayed ACK of the headers (40 ms on Linux) on a kept-alive connection. The metadata
    # services answer without that delay; so does the simulator.
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, open_now=True)

    def finish(self) -> None:
        self.server.track(self.connection, open_now=False)
        super().finish()

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: object) -> None:
        # Requests are not logged: the simulator logs what changed, not every poll.
        return

    def _dispatch(self) -> None:
        parts = urlsplit(self.path)
        query = {key: values[0] for key, values in parse_qs(parts.query, keep_blank_values=True).items()}
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        body = self.rfile.read(min(max(length, 0), _MAX_BODY)) if length > 0 else b""
        if length > _MAX_BODY:
            self.close_connection = True  # the unread rest would be taken for the next request
        request = MetadataRequest(
            method=self.command,
            path=parts.path,
            query=query,
            headers={key.lower(): value for key, value in self.headers.items()},
            body=body,
            vm=self.server.vm,
        )
        router = self.server.router
        if router is None:
            self._write(Response(status=503, body=b'{"error": "the simulator is starting"}'))
            return
        response = router.route(request)
        if response is None:
            self.close_connection = True  # the `drop` fault: close without any answer
            return
        self._write(response)

    def _write(self, response: Response) -> None:
        self.send_response(response.status)
        if response.body or response.status != 200:
            self.send_header("Content-Type", response.content_type)
        for name, value in response.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        try:
            self.end_headers()
            self.wfile.write(response.body)
        except OSError:
            # The client gave up (a timeout on a long-poll), or its VM stopped answering meanwhile.
            self.close_connection = True


def url_of(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def bind_consecutive(host: str, port: int, vm_names: Sequence[str]) -> list[VmServer]:
    """One bound server per VM on consecutive ports starting at `port` (0: any free run)."""
    server_cls = VmServer6 if ":" in host else VmServer
    if port != 0:
        return _bind_run(server_cls, host, port, vm_names)
    for _ in range(_PORT_ATTEMPTS):
        # Let the OS pick the first port, then try to take the ones after it.
        first = server_cls((host, 0), vm_names[0])
        base = first.server_address[1]
        try:
            rest = _bind_run(server_cls, host, base + 1, vm_names[1:]) if len(vm_names) > 1 else []
        except OSError:
            first.server_close()
            continue
        return [first, *rest]
    raise OSError(f"found no {len(vm_names)} consecutive free ports on {host}; pass --port explicitly")


def _bind_run(server_cls: type[VmServer], host: str, port: int, vm_names: Sequence[str]) -> list[VmServer]:
    servers: list[VmServer] = []
    try:
        for offset, vm in enumerate(vm_names):
            if port + offset > 65535:
                raise OSError(f"port {port + offset} is out of range")
            servers.append(server_cls((host, port + offset), vm))
    except OSError as exc:
        for server in servers:
            server.server_close()
        raise OSError(
            f"cannot listen on {host}:{port}..{port + len(vm_names) - 1} for {len(vm_names)} VM(s): {exc}; "
            f"choose another --port (0 finds free ports)"
        ) from exc
    return servers
