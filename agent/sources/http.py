"""HTTP to the metadata service, and nowhere else.

- Redirects are never followed and proxies from the environment are never used: the
  metadata headers must only ever reach the link-local metadata endpoint
  (docs/agent.md#what-it-does-and-why-you-can-trust-it).
- Every failure becomes a `MetadataUnavailableError` with a `kind` used in metrics and
  logs; callers back off and retry. 404 is an answer (absent key), not a failure.
- It speaks HTTP/1.1 through the standard library's `http.client`, over connections it keeps
  open. requests (and urllib3 under it) brought what this client turns off anyway (proxies and
  netrc from the environment, redirects, cookies, retries) and cost a poll nearly twice the CPU
  time and the agent 3 MB of memory (docs/performance.md). What they did that matters here is
  done here: timeouts for the connection and for the answer, a kept connection the service
  closed meanwhile is replaced once, and any connection an answer leaves unusable is closed.
"""

from __future__ import annotations

import http.client
import logging
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union
from urllib.parse import urlencode, urlsplit

from agent.timing import RateLimiter
from wire.errors import RetryableError

LOGGER = logging.getLogger("mbridge.metadata")

Timeout = Union[float, tuple[float, float]]

# (connect, read) seconds. The link-local endpoint answers in milliseconds when healthy.
DEFAULT_TIMEOUT: tuple[float, float] = (2.0, 10.0)
# Connections kept open to the metadata service: the watcher's, and an approval's or a proof's
# while a long-poll holds the watcher's (more are opened when needed, and not kept).
KEPT_CONNECTIONS = 2
# Client errors that mean "not now" rather than "no": the request timed out (408), IMDS's 410 ("retry
# after some time for a max of 70 seconds"), too early (425), too many requests (429).
TRANSIENT_CLIENT_ERRORS = frozenset({408, 410, 425, 429})
# What a kept connection that the service closed since its last answer raises when used again.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class MetadataUnavailableError(RetryableError):
    """The metadata service did not give a usable answer; retry after a backoff.

    `kind` is one of: rate_limited, server_error, client_error, timeout, connection,
    redirect, malformed.
    """

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status

    @property
    def refused(self) -> bool:
        """The service answered and said no, as it will next time: a client error such as 404 (no
        such endpoint: Microsoft's Scheduled Events mock server has no attested document) or 400.
        Throttling, server errors, timeouts and unreachable services are not refusals."""
        return self.status is not None and 400 <= self.status < 500 and self.status not in TRANSIENT_CLIENT_ERRORS


@dataclass(frozen=True)
class MetadataResponse:
    """An answer of the metadata service, read whole."""

    status_code: int
    content: bytes
    headers: http.client.HTTPMessage  # .get() is case-insensitive

    @property
    def text(self) -> str:
        # The metadata services answer in UTF-8; a byte that is not cannot hide anything here.
        return self.content.decode("utf-8", errors="replace")


class MetadataHttp:
    """A small client for one metadata base URL (e.g. http://169.254.169.254)."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        *,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = dict(headers)
        self._limiter = limiter
        # Nothing here reads HTTP(S)_PROXY or .netrc: metadata requests go straight to the
        # link-local address, and the headers go nowhere else. No retries: the callers back off.
        self._connections = _Connections(self.base_url)

    def get(
        self, path: str, params: Mapping[str, str] | None = None, timeout: Timeout = DEFAULT_TIMEOUT
    ) -> MetadataResponse:
        return self._send("GET", path, params, None, timeout)

    def post(
        self,
        path: str,
        params: Mapping[str, str] | None,
        body: bytes,
        timeout: Timeout = DEFAULT_TIMEOUT,
    ) -> MetadataResponse:
        return self._send("POST", path, params, body, timeout)

    def close(self) -> None:
        self._connections.close()

    def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: bytes | None,
        timeout: Timeout,
    ) -> MetadataResponse:
        if self._limiter is not None:
            self._limiter.acquire()
        target = self._connections.path_prefix + path + ("?" + urlencode(params) if params else "")
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        try:
            response = self._connections.exchange(method, target, body, headers, connect, read)
        except (TimeoutError, socket.timeout) as exc:  # connecting or waiting for the answer (3.9: not one class)
            raise MetadataUnavailableError("timeout", f"{method} {path}: no answer in time ({exc})") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise MetadataUnavailableError(
                "connection", f"{method} {path}: cannot reach the metadata service at {self.base_url} ({exc})"
            ) from exc
        status = response.status_code
        if 300 <= status < 400:
            raise MetadataUnavailableError(
                "redirect",
                f"{method} {path}: answered {status} to {response.headers.get('Location')!r}; "
                "redirects are never followed (metadata headers stay on the metadata endpoint)",
                status,
            )
        if status == 429:
            raise MetadataUnavailableError("rate_limited", f"{method} {path}: 429 Too Many Requests", status)
        if status >= 500:
            raise MetadataUnavailableError("server_error", f"{method} {path}: {status} {_snippet(response)}", status)
        return response


class _Connections:
    """HTTP/1.1 connections to one host, each used by one request at a time and kept for the next."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the metadata URL must be http://host[:port], not {base_url!r}")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self.path_prefix = parts.path.rstrip("/")
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def exchange(
        self, method: str, target: str, body: bytes | None, headers: Mapping[str, str], connect: float, read: float
    ) -> MetadataResponse:
        """One request and its whole answer. A kept connection that turns out closed by the service
        is replaced once (GETs, and the idempotent StartRequests POST); other failures raise."""
        connection, kept = self._take(connect)
        try:
            try:
                return self._exchange_on(connection, method, target, body, headers, read)
            except _STALE:
                if not kept:
                    raise
                connection.close()
                connection = self._new(connect)
                return self._exchange_on(connection, method, target, body, headers, read)
        except BaseException:
            connection.close()  # what it carries next is unknown: never reused
            raise

    def _exchange_on(
        self,
        connection: http.client.HTTPConnection,
        method: str,
        target: str,
        body: bytes | None,
        headers: Mapping[str, str],
        read: float,
    ) -> MetadataResponse:
        if connection.sock is None:
            connection.connect()  # within the connect timeout the connection was made with
        connection.sock.settimeout(read)
        connection.request(method, target, body=body, headers=dict(headers))
        answer = connection.getresponse()
        content = answer.read()
        response = MetadataResponse(answer.status, content, answer.headers)
        if answer.will_close:
            connection.close()
        else:
            self._give_back(connection)
        return response

    def _take(self, connect: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                connection = self._idle.pop()
                connection.timeout = connect
                return connection, True
        return self._new(connect), False

    def _new(self, connect: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return kind(self._host, self._port, timeout=connect)

    def _give_back(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < KEPT_CONNECTIONS:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def _snippet(response: MetadataResponse) -> str:
    text = response.text.strip().replace("\n", " ")
    return text[:200]
