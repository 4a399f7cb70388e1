"""The health server on a reachable address: nobody on the network can make /readyz fail.

A health-probe load balancer decides from GET /readyz whether the VM takes traffic, so the
server must keep answering it promptly while anyone who can reach the port opens sockets,
sends requests slowly or never, or sends huge headers (docs/agent.md, "Health and metrics").
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.health import HealthServer, Metrics, Readiness
from agent.health.eviction import peer_of
from tests.kit import FakeClock
from tests.peers import require_peer
from tests.waiting import wait_until
from wire.version import version

SLOW_LORIS_SOCKETS = 1000
# The figures docs/agent.md promises: a request's line and headers within 5 s, at most
# 64 connections held, 8 KiB of request line and headers.
DOCUMENTED_REQUEST_TIMEOUT = 5.0
DOCUMENTED_MAX_CONNECTIONS = 64
DOCUMENTED_MAX_HEAD_BYTES = 8192
HALF_A_REQUEST = b"GET /readyz HTTP/1.1\r\nHost: agent\r\n"
READYZ = b"GET /readyz HTTP/1.1\r\nHost: agent\r\n\r\n"
# Another loopback address (Linux routes all of 127/8 to lo): a flood from a host that is not the probe's.
FLOOD_ADDRESS = "127.0.0.2"
# More connections than the table holds, opened after the probe's: each one makes the server choose whom to close.
FLOOD_AFTER_THE_PROBE = 3 * DOCUMENTED_MAX_CONNECTIONS


@pytest.fixture
def metrics() -> Metrics:
    metrics = Metrics()
    metrics.describe("mbridge_outbox_depth", "gauge", "envelopes waiting for the bus")
    metrics.gauge("mbridge_outbox_depth", lambda: 0)
    metrics.inc("mbridge_polls_total", result="changed")
    return metrics


@pytest.fixture
def readiness() -> Readiness:
    return Readiness(follows_commands=True)


@pytest.fixture
def port(metrics: Metrics, readiness: Readiness) -> Iterator[int]:
    server = HealthServer(
        "127.0.0.1",
        0,
        metrics=metrics,
        readiness=readiness,
        liveness=lambda: {"healthy": True, "threads": {"poller": True}},
    )
    server.start()
    try:
        yield int(server.address.rsplit(":", 1)[1])
    finally:
        server.stop()


@pytest.fixture
def frozen_server(metrics: Metrics, readiness: Readiness) -> Iterator[HealthServer]:
    """A server whose clock stands still: no deadline passes however long the machine takes, so
    what it closes is decided by its table alone."""
    server = HealthServer(
        "127.0.0.1",
        0,
        metrics=metrics,
        readiness=readiness,
        liveness=lambda: {"healthy": True, "threads": {}},
        monotonic=FakeClock().monotonic,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def enough_open_files() -> Iterator[None]:
    """Room for the test's own sockets plus the server's, restored afterwards."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * SLOW_LORIS_SOCKETS + 256
    if hard != resource.RLIM_INFINITY and hard < needed:
        # The machine, like a peer: a CI image must allow it, or the slow-loris cases would never run there.
        require_peer(False, f"the hard open-file limit {hard} is below {needed}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def port_of(server: HealthServer) -> int:
    return int(server.address.rsplit(":", 1)[1])


def connect_from(address: str, port: int) -> socket.socket:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(address, 0))
    except OSError as exc:  # not Linux: only 127.0.0.1 is a loopback address
        if os.environ.get("CI") == "true":  # CI runs on Linux, where all of 127/8 is loopback
            pytest.fail(f"cannot connect from {address}: {exc}")
        pytest.skip(f"cannot connect from {address}: {exc}")


def closed_by_the_server(sockets: list[socket.socket]) -> list[socket.socket]:
    """The sockets the server has closed so far. The server says nothing before a request, so a
    socket that became readable was closed (end of stream or reset)."""
    poller = select.poll()
    by_fd = {sock.fileno(): sock for sock in sockets}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in poller.poll(0)]


def wait_until_closed(sockets: list[socket.socket], count: int) -> list[socket.socket]:
    """Wait (on the server, not on a clock) until it has closed `count` of `sockets`; return those."""
    wait_until(
        lambda: len(closed_by_the_server(sockets)) >= count,
        30,
        lambda: f"the server to close {count} connections (closed: {len(closed_by_the_server(sockets))})",
    )
    return closed_by_the_server(sockets)


def ask(sock: socket.socket, request: bytes = READYZ) -> bytes:
    """Send a request on a connection opened earlier; return all the server says before it closes."""
    try:
        sock.sendall(request)
        return sock.makefile("rb").read()
    except OSError:  # the server had closed it: the request met a reset
        return b""


def open_slow_loris(port: int, count: int) -> list[socket.socket]:
    """Every other socket sends half a request, the rest nothing; none ever finishes."""
    sockets = []
    for index in range(count):
        sock = connect(port)
        if index % 2:
            sock.sendall(HALF_A_REQUEST)
        sockets.append(sock)
    return sockets


def get(port: int, path: str, timeout: float = 1.0) -> tuple[int, dict[str, str], bytes, float]:
    """Status, headers, body and how long the whole exchange took."""
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        return response.status, dict(response.getheaders()), body, time.monotonic() - started
    finally:
        connection.close()


def exchange(port: int, request: bytes) -> bytes:
    """Send raw bytes; return everything the server says before it closes."""
    with connect(port) as sock:
        sock.sendall(request)
        return sock.makefile("rb").read()


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """True when the server ends the connection (EOF or reset) within `within` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def trickle(sock: socket.socket, request: bytes, every: float) -> tuple[float, bytes]:
    """Send one byte every `every` seconds; when the server speaks or hangs up, say when and what."""
    started = time.monotonic()
    for byte in request:
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return time.monotonic() - started, b""
        readable, _, _ = select.select([sock], [], [], every)
        if readable:
            try:
                return time.monotonic() - started, sock.recv(4096)
            except ConnectionResetError:
                return time.monotonic() - started, b""
    readable, _, _ = select.select([sock], [], [], 2.0)
    return time.monotonic() - started, sock.recv(4096) if readable else b""


def open_file_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_thousand_slow_sockets_neither_starve_the_probe_nor_add_threads(port: int, enough_open_files: None) -> None:
    # GIVEN a running health server and the process's thread count
    threads_before = threading.active_count()

    # WHEN 1,000 sockets connect: half send half a request, half nothing, none ever finishes
    sockets = open_slow_loris(port, SLOW_LORIS_SOCKETS)
    try:
        # THEN GET /readyz still answers 200 within 1 s, every time
        for _ in range(5):
            status, _, body, elapsed = get(port, "/readyz", timeout=1.0)
            assert status == 200
            assert json.loads(body)["ready"] is True
            assert elapsed < 1.0
        # AND the process has no more threads than before
        assert threading.active_count() - threads_before <= 2
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors through /proc")
def test_the_server_holds_no_more_connections_than_its_cap(port: int, enough_open_files: None) -> None:
    # GIVEN a running health server and the process's open descriptors
    descriptors_before = open_file_descriptors()

    # WHEN 1,000 sockets connect and never finish a request
    sockets = open_slow_loris(port, SLOW_LORIS_SOCKETS)
    try:
        # (the listen queue is first in, first out: once this is answered, every socket was accepted)
        assert get(port, "/readyz", timeout=1.0)[0] == 200

        # THEN the server's side keeps at most its cap of them open
        held_by_server = open_file_descriptors() - descriptors_before - len(sockets)
        assert held_by_server <= DOCUMENTED_MAX_CONNECTIONS
    finally:
        for sock in sockets:
            sock.close()


def test_a_probe_that_connected_outlasts_a_flood_from_another_address(frozen_server: HealthServer) -> None:
    # GIVEN a table full of idle connections from another host
    port = port_of(frozen_server)
    flood = [connect_from(FLOOD_ADDRESS, port) for _ in range(DOCUMENTED_MAX_CONNECTIONS)]
    # AND a probe that has connected but not sent its request yet (a kubelet sends it a few ms later)
    probe = connect(port)
    try:
        # WHEN that host opens many more, faster than the probe sends its request
        flood += [connect_from(FLOOD_ADDRESS, port) for _ in range(FLOOD_AFTER_THE_PROBE)]
        closed = wait_until_closed([*flood, probe], FLOOD_AFTER_THE_PROBE + 1)

        # THEN the server made room by closing the flood's connections, never the probe's
        assert probe not in closed
        # AND the probe's request, when it comes, is answered
        assert ask(probe).startswith(b"HTTP/1.0 200 ")
    finally:
        for sock in [*flood, probe]:
            sock.close()


def test_a_new_probe_gets_in_when_another_host_holds_every_connection(frozen_server: HealthServer) -> None:
    # GIVEN another host holding every connection of the table, and going on opening more
    port = port_of(frozen_server)
    flood = [connect_from(FLOOD_ADDRESS, port) for _ in range(DOCUMENTED_MAX_CONNECTIONS)]
    probe = connect(port)
    try:
        flood += [connect_from(FLOOD_ADDRESS, port) for _ in range(FLOOD_AFTER_THE_PROBE)]
        wait_until_closed([*flood, probe], FLOOD_AFTER_THE_PROBE + 1)

        # WHEN a second probe from the probe's host connects and asks at once
        # THEN it is answered, and the first probe is still held
        assert exchange(port, READYZ).startswith(b"HTTP/1.0 200 ")
        assert probe not in closed_by_the_server([probe])
    finally:
        for sock in [*flood, probe]:
            sock.close()


def test_an_answered_connection_kept_open_goes_before_one_waiting_for_its_request(frozen_server: HealthServer) -> None:
    # GIVEN a full table from one address: idle connections, then a client that got its answer and
    # keeps the connection open
    port = port_of(frozen_server)
    idle = [connect(port) for _ in range(DOCUMENTED_MAX_CONNECTIONS - 1)]
    answered = connect(port)
    try:
        assert ask(answered).startswith(b"HTTP/1.0 200 ")  # read to the server's end; not closed here

        # WHEN one more client connects and asks
        # THEN it is answered, and the room was made by closing the answered one, not the oldest idle one
        assert exchange(port, READYZ).startswith(b"HTTP/1.0 200 ")
        assert closed_by_the_server(idle) == []
    finally:
        for sock in [*idle, answered]:
            sock.close()


@pytest.mark.parametrize(
    ("address", "counted_as"),
    [
        (("10.0.0.7", 40000), "10.0.0.7"),
        (("2001:db8:0:1::7", 40000, 0, 0), "2001:db8:0:1::/64"),
        (("2001:db8:0:1:ffff:ffff:ffff:ffff", 40000, 0, 0), "2001:db8:0:1::/64"),  # the same host's /64
        (("::ffff:10.0.0.7", 40000, 0, 0), "10.0.0.7"),  # a dual-stack listener's IPv4 client
        (("fe80::1%eth0", 40000, 0, 2), "fe80::/64"),
    ],
)
def test_connections_count_under_their_hosts_address(address: tuple[object, ...], counted_as: str) -> None:
    # An IPv6 host is given a /64: counting its addresses one by one would let it pass for many hosts.
    assert peer_of(address) == counted_as


@pytest.mark.slow
def test_a_slow_or_silent_client_is_cut_off_after_the_request_timeout(port: int) -> None:
    # GIVEN a client that connects and says nothing
    silent = connect(port)
    slow = connect(port)
    request = b"GET /readyz HTTP/1.1\r\nHost: agent\r\nUser-Agent: one-byte-at-a-time\r\n\r\n"
    try:
        # WHEN another sends a whole, valid request one byte every 0.25 s (about 17 s in all)
        cut_after, answer = trickle(slow, request, every=0.25)

        # THEN the server hangs up on it at the request timeout, without an answer
        assert answer == b""
        assert DOCUMENTED_REQUEST_TIMEOUT - 0.5 <= cut_after <= DOCUMENTED_REQUEST_TIMEOUT + 2.0
        # AND the silent one is gone too
        assert closed_by_server(silent, within=1.0)
    finally:
        silent.close()
        slow.close()


@pytest.mark.parametrize(
    "request_bytes",
    [
        # a header past the limit, in a complete request
        b"GET /readyz HTTP/1.1\r\nHost: agent\r\nX-Padding: " + b"a" * 2 * DOCUMENTED_MAX_HEAD_BYTES + b"\r\n\r\n",
        # a request line past the limit, never finished: the server must not wait for the rest
        b"GET /readyz?" + b"q" * 2 * DOCUMENTED_MAX_HEAD_BYTES,
    ],
    ids=["headers", "request-line"],
)
def test_a_request_head_over_the_limit_is_refused(port: int, request_bytes: bytes) -> None:
    # GIVEN a request whose line or headers exceed the documented limit
    # WHEN it is sent
    answer = exchange(port, request_bytes)

    # THEN the server answers 431 and closes the connection
    assert answer.startswith(b"HTTP/1.0 431 ")


@pytest.mark.parametrize(
    ("path", "status", "content_type"),
    [
        ("/readyz", 200, "application/json"),
        ("/readyz?verbose=1", 200, "application/json"),
        ("/healthz", 200, "application/json"),
        ("/metrics", 200, "text/plain; version=0.0.4; charset=utf-8"),
        ("/nope", 404, "application/json"),
    ],
)
def test_normal_requests_are_answered_as_before(port: int, path: str, status: int, content_type: str) -> None:
    # GIVEN a running health server
    # WHEN a client asks for one of its paths
    answered, headers, body, _ = get(port, path)

    # THEN the status, content type and length are those the endpoints always had
    assert answered == status
    assert headers["Content-Type"] == content_type
    assert int(headers["Content-Length"]) == len(body)


def test_bodies_are_those_the_endpoints_always_had(port: int, metrics: Metrics, readiness: Readiness) -> None:
    # GIVEN a running health server and a VM drained by command
    readiness.set_drained(True, "drain command c-1")

    # WHEN its endpoints are read
    readyz = get(port, "/readyz")
    healthz = get(port, "/healthz")
    scraped = get(port, "/metrics")
    missing = get(port, "/nope")

    # THEN /readyz is 503 with the reason, and the rest answer as they always did
    assert (readyz[0], json.loads(readyz[2])) == (503, {"ready": False, "reason": "drain command c-1"})
    # ... with the release added to /healthz (wire.version), as a probe of the fleet reads it
    assert json.loads(healthz[2]) == {"healthy": True, "threads": {"poller": True}, "version": version()}
    assert scraped[2].decode() == metrics.render()
    assert json.loads(missing[2]) == {"error": "not found; try /healthz, /readyz or /metrics"}


def test_a_kept_alive_connection_is_closed_after_its_answer(port: int) -> None:
    # GIVEN a client that asks to keep its connection open
    # WHEN it reads the answer
    answer = exchange(port, b"GET /readyz HTTP/1.1\r\nHost: agent\r\nConnection: keep-alive\r\n\r\n")

    # THEN it gets the answer and the end of the connection at once: nothing stays open idle
    assert answer.startswith(b"HTTP/1.0 200 ")
    assert answer.endswith(b'"ready": true, "reason": "ready"}')


def test_other_methods_and_garbled_requests_are_refused(port: int) -> None:
    # GIVEN a running health server
    # WHEN a client posts, or sends a line that is not HTTP
    post = exchange(port, b"POST /readyz HTTP/1.1\r\nHost: agent\r\nContent-Length: 0\r\n\r\n")
    garbled = exchange(port, b"hello\r\n\r\n")

    # THEN they get 501 and 400
    assert post.startswith(b"HTTP/1.0 501 ")
    assert garbled.startswith(b"HTTP/1.0 400 ")


def test_idle_connections_cost_no_cpu(port: int) -> None:
    # GIVEN twenty connections that say nothing
    sockets = [connect(port) for _ in range(20)]
    try:
        # WHEN a second passes
        cpu_before = time.process_time()
        time.sleep(1.0)
        cpu_used = time.process_time() - cpu_before

        # THEN the server waited without spinning
        assert cpu_used < 0.05
    finally:
        for sock in sockets:
            sock.close()


def test_a_pass_of_the_loop_that_fails_is_logged_and_the_endpoints_carry_on(
    metrics: Metrics, readiness: Readiness, caplog: pytest.LogCaptureFixture
) -> None:
    server = HealthServer(
        "127.0.0.1", 0, metrics=metrics, readiness=readiness, liveness=lambda: {"healthy": True, "threads": {}}
    )
    failed = threading.Event()

    def fails_once() -> None:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("a fault in one pass")

    server._drop_overdue = fails_once  # type: ignore[method-assign]  # the fault, in the loop's own step
    server.start()
    try:
        port = int(server.address.rsplit(":", 1)[1])
        status, _, _, _ = get(port, "/healthz", timeout=5.0)  # this request's pass fails after answering
        assert failed.wait(5.0)
        status, _, _, _ = get(port, "/healthz", timeout=5.0)
        assert status == 200
        assert "the health server's loop failed" in caplog.text
    finally:
        server.stop()
