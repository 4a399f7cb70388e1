"""The agent's HTTP to the metadata service (agent/sources/http.py), against small real servers.

Each server is a listening socket of this test that answers as told, so what the client does
on the wire (a kept connection, one closed under it, an answer that never comes) is seen as
it happens.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from agent.sources.http import MetadataHttp, MetadataUnavailableError

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
CLOSING = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"


class Server:
    """Accepts connections; `answer(connection, request_number)` handles each request."""

    def __init__(self, answer: Callable[[socket.socket, int], bool]) -> None:
        self.connections = 0
        self.requests: list[bytes] = []
        self._answer = answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._talk, args=(connection,), daemon=True).start()

    def _talk(self, connection: socket.socket) -> None:
        with connection:
            while True:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = connection.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                self.requests.append(head)
                if not self._answer(connection, len(self.requests)):
                    return

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[socket.socket, int], bool]], Server]]:
    servers: list[Server] = []

    def start(answer: Callable[[socket.socket, int], bool]) -> Server:
        servers.append(Server(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def answer_ok(connection: socket.socket, _: int) -> bool:
    connection.sendall(OK)
    return True


def test_one_connection_carries_every_poll(serve: Callable[..., Server]) -> None:
    server = serve(answer_ok)
    http = MetadataHttp(server.url, {"Metadata": "true"})
    for _ in range(5):
        response = http.get("/metadata/scheduledevents", {"api-version": "2020-07-01"})
        assert response.status_code == 200
        assert response.content == b"{}"
    assert server.connections == 1
    first = server.requests[0].decode()
    assert first.startswith("GET /metadata/scheduledevents?api-version=2020-07-01 HTTP/1.1\r\n")
    assert "Metadata: true" in first
    http.close()


def test_a_kept_connection_the_service_closed_is_replaced_once(serve: Callable[..., Server]) -> None:
    def answer_then_hang_up(connection: socket.socket, number: int) -> bool:
        connection.sendall(OK)
        return number != 1  # after the first answer, the service closes the connection without saying so

    server = serve(answer_then_hang_up)
    http = MetadataHttp(server.url, {})
    assert http.get("/a").status_code == 200
    assert http.get("/b").status_code == 200  # on a new connection, not an error
    assert server.connections == 2
    http.close()


def test_an_answer_that_says_close_is_not_kept(serve: Callable[..., Server]) -> None:
    def answer_closing(connection: socket.socket, _: int) -> bool:
        connection.sendall(CLOSING)
        return False

    server = serve(answer_closing)
    http = MetadataHttp(server.url, {})
    assert http.get("/a").content == b"{}"
    assert http.get("/b").content == b"{}"
    assert server.connections == 2
    http.close()


def test_no_answer_in_time_is_a_timeout_and_the_connection_is_dropped(serve: Callable[..., Server]) -> None:
    def hang_first(connection: socket.socket, number: int) -> bool:
        if number == 1:
            threading.Event().wait(2.0)  # longer than the client's read timeout
            return False
        connection.sendall(OK)
        return True

    server = serve(hang_first)
    http = MetadataHttp(server.url, {})
    with pytest.raises(MetadataUnavailableError) as raised:
        http.get("/slow", timeout=(1.0, 0.2))
    assert raised.value.kind == "timeout"
    assert http.get("/next").status_code == 200  # a new connection: the late answer never reaches it
    assert server.connections == 2
    http.close()


def test_nobody_listening_is_a_connection_failure() -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        port = placeholder.getsockname()[1]
    http = MetadataHttp(f"http://127.0.0.1:{port}", {})
    with pytest.raises(MetadataUnavailableError) as raised:
        http.get("/x")
    assert raised.value.kind == "connection"


def test_a_redirect_is_refused_and_not_followed(serve: Callable[..., Server]) -> None:
    def redirect(connection: socket.socket, _: int) -> bool:
        connection.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere.invalid/\r\nContent-Length: 0\r\n\r\n")
        return True

    server = serve(redirect)
    http = MetadataHttp(server.url, {"Metadata": "true"})
    with pytest.raises(MetadataUnavailableError) as raised:
        http.get("/x")
    assert raised.value.kind == "redirect"
    assert "elsewhere.invalid" in str(raised.value)
    assert len(server.requests) == 1
    http.close()


def test_a_body_posted_goes_with_its_length_and_type(serve: Callable[..., Server]) -> None:
    server = serve(answer_ok)
    http = MetadataHttp(server.url, {"Metadata": "true"})
    body = b'{"StartRequests": []}'
    assert http.post("/metadata/scheduledevents", {"api-version": "2020-07-01"}, body).status_code == 200
    request = server.requests[0].decode()
    assert request.startswith("POST /metadata/scheduledevents?api-version=2020-07-01 ")
    assert "Content-Type: application/json" in request
    assert f"Content-Length: {len(body)}" in request
    http.close()


def test_a_url_that_is_not_http_is_refused() -> None:
    with pytest.raises(ValueError, match="http://host"):
        MetadataHttp("ftp://169.254.169.254", {})
