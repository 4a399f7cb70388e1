"""GoogleCerts against a real local HTTP server: caching by Cache-Control, the refetch on an unknown
key id and its throttle, and fetches that fail. Time is a fake clock; HTTP is real."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("google.auth", reason="google-auth is not installed (the 3.9 compatibility run omits it)")

import requests

from functions.trust.gce_token import (
    MAX_CACHE_SECONDS,
    MIN_CACHE_SECONDS,
    CertsUnavailableError,
    GoogleCerts,
    TokenError,
    cache_lifetime,
    verify_with_source,
)
from simulator.gce_identity import TokenIssuer
from tests.kit import FakeClock
from wire.errors import RetryableError

AUDIENCE = "maintenance-bridge/" + "ef" * 32
VM: dict[str, Any] = {
    "instance_name": "gce-vm-0",
    "instance_id": "1234567890123456789",
    "project_id": "prod-project",
    "project_number": "123456789012",
    "zone": "us-central1-a",
}


class CertsServer:
    """Serves one certificate document with a Cache-Control header, and counts the requests."""

    def __init__(self) -> None:
        self.body = b"{}"
        self.status = 200
        self.cache_control = "public, max-age=3600, must-revalidate, no-transform"
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += 1
                self.send_response(server.status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Cache-Control", server.cache_control)
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}/oauth2/v1/certs"
        self._thread = threading.Thread(target=lambda: self._http.serve_forever(poll_interval=0.02), daemon=True)

    def serve(self, certs: dict[str, str]) -> None:
        self.body = json.dumps(certs).encode()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture(scope="module")
def issuers() -> tuple[TokenIssuer, TokenIssuer]:
    """Today's keys and tomorrow's (after a rotation)."""
    return TokenIssuer.generate(), TokenIssuer.generate()


@pytest.fixture
def server() -> Iterator[CertsServer]:
    certs_server = CertsServer()
    certs_server.start()
    yield certs_server
    certs_server.stop()


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as http:
        yield http


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(monotonic=1000.0)


def make_certs(server: CertsServer, session: requests.Session, clock: FakeClock) -> GoogleCerts:
    return GoogleCerts(session, server.url, timeout=5.0, clock=clock.monotonic)


# --------------------------------------------------------------------------- caching


def test_certs_are_cached_for_max_age_then_fetched_again(
    server: CertsServer, session: requests.Session, clock: FakeClock, issuers: tuple[TokenIssuer, TokenIssuer]
) -> None:
    # GIVEN a server answering with max-age=300
    today, tomorrow = issuers
    server.serve(today.certs())
    server.cache_control = "public, max-age=300"
    certs = make_certs(server, session, clock)
    # WHEN the set is read twice, then again just before and just after 300 s
    first = dict(certs.get())
    certs.get()
    clock.advance(299)
    certs.get()
    requests_within = server.requests
    server.serve(tomorrow.certs())
    clock.advance(2)
    after = dict(certs.get())
    # THEN one request served the first 299 s, and the set was fetched again after
    assert first == today.certs()
    assert requests_within == 1
    assert after == tomorrow.certs()
    assert server.requests == 2


@pytest.mark.parametrize(
    ("cache_control", "age", "seconds"),
    [
        ("public, max-age=23005, must-revalidate, no-transform", "", 23005.0),
        ("public, max-age=3600", "600", 3000.0),
        ("max-age=5", "", MIN_CACHE_SECONDS),
        ("max-age=999999999", "", MAX_CACHE_SECONDS),
        ("no-cache", "", MIN_CACHE_SECONDS),
        ("", "", MIN_CACHE_SECONDS),
        ("max-age=soon", "", MIN_CACHE_SECONDS),
        ("MAX-AGE=120", "", 120.0),
        ("max-age=100", "90", MIN_CACHE_SECONDS),
    ],
)
def test_the_cache_lifetime_is_max_age_less_age_within_bounds(cache_control: str, age: str, seconds: float) -> None:
    assert cache_lifetime(cache_control, age) == seconds


def test_a_tiny_max_age_still_caches_for_a_minute(
    server: CertsServer, session: requests.Session, clock: FakeClock, issuers: tuple[TokenIssuer, TokenIssuer]
) -> None:
    # GIVEN a server answering with max-age=1
    server.serve(issuers[0].certs())
    server.cache_control = "max-age=1"
    certs = make_certs(server, session, clock)
    # WHEN the set is read at 0 s and 59 s, then at 61 s
    certs.get()
    clock.advance(59)
    certs.get()
    within = server.requests
    clock.advance(2)
    certs.get()
    # THEN the first minute took one request
    assert within == 1
    assert server.requests == 2


# --------------------------------------------------------------------------- unknown key ids


def test_an_unknown_key_id_refetches_the_set_once_and_finds_a_rotated_key(
    server: CertsServer, session: requests.Session, clock: FakeClock, issuers: tuple[TokenIssuer, TokenIssuer]
) -> None:
    # GIVEN a cached set, and then Google rotating to new keys
    today, tomorrow = issuers
    server.serve(today.certs())
    certs = make_certs(server, session, clock)
    certs.get()
    server.serve({**today.certs(), **tomorrow.certs()})
    clock.advance(120)
    # WHEN a token signed with a new key is verified through the source
    now = datetime.now(timezone.utc)
    token = tomorrow.issue(AUDIENCE, full=True, now=now, **VM)
    identity = verify_with_source(token, source=certs, audience=AUDIENCE, valid_at=now, now=now)
    # THEN the set was fetched again and the token verified
    assert identity.instance_name == "gce-vm-0"
    assert server.requests == 2


def test_unknown_key_ids_refetch_at_most_once_a_minute(
    server: CertsServer, session: requests.Session, clock: FakeClock, issuers: tuple[TokenIssuer, TokenIssuer]
) -> None:
    # GIVEN a set fetched at 0 s
    server.serve(issuers[0].certs())
    certs = make_certs(server, session, clock)
    certs.get()
    # WHEN made-up key ids come at 0 s, 30 s and 59 s, then at 61 s
    counts = []
    for step in (0, 30, 29, 2):
        clock.advance(step)
        certs.get_for("made-up-key-id")
        counts.append(server.requests)
    # THEN only the one at 61 s fetched again
    assert counts == [1, 1, 1, 2]


def test_a_known_key_id_does_not_refetch(
    server: CertsServer, session: requests.Session, clock: FakeClock, issuers: tuple[TokenIssuer, TokenIssuer]
) -> None:
    server.serve(issuers[0].certs())
    certs = make_certs(server, session, clock)
    certs.get()
    clock.advance(600)
    certs.get_for(issuers[0].keys[0].kid)
    assert server.requests == 1


def test_a_key_id_unknown_after_the_refetch_is_refused_as_unknown(
    server: CertsServer, session: requests.Session, clock: FakeClock, issuers: tuple[TokenIssuer, TokenIssuer]
) -> None:
    # GIVEN a set that does not have the token's key, even after a refetch
    today, tomorrow = issuers
    server.serve(today.certs())
    certs = make_certs(server, session, clock)
    now = datetime.now(timezone.utc)
    token = tomorrow.issue(AUDIENCE, full=True, now=now, **VM)
    # THEN the token is refused for its key id (a TokenError, not a retry)
    with pytest.raises(TokenError, match="not among the"):
        verify_with_source(token, source=certs, audience=AUDIENCE, valid_at=now, now=now)


# --------------------------------------------------------------------------- fetches that fail


def test_a_failed_fetch_is_retryable_and_not_repeated_for_a_few_seconds(
    server: CertsServer, session: requests.Session, clock: FakeClock, issuers: tuple[TokenIssuer, TokenIssuer]
) -> None:
    # GIVEN a server answering 503
    server.status = 503
    certs = make_certs(server, session, clock)
    # WHEN the set is read, again 1 s later, and again 6 s later once the server is back
    with pytest.raises(CertsUnavailableError, match="503") as first:
        certs.get()
    clock.advance(1)
    with pytest.raises(CertsUnavailableError):
        certs.get()
    requests_while_failing = server.requests
    server.status = 200
    server.serve(issuers[0].certs())
    clock.advance(5)
    recovered = dict(certs.get())
    # THEN the error is retryable (not a refusal of the token), the second read sent nothing,
    # and the set came once the server answered
    assert isinstance(first.value, RetryableError)
    assert not isinstance(first.value, TokenError)
    assert requests_while_failing == 1
    assert recovered == issuers[0].certs()


def test_an_expired_set_is_not_used_when_the_fetch_fails(
    server: CertsServer, session: requests.Session, clock: FakeClock, issuers: tuple[TokenIssuer, TokenIssuer]
) -> None:
    # GIVEN a set cached for 60 s, and the server failing after that
    server.serve(issuers[0].certs())
    server.cache_control = "max-age=60"
    certs = make_certs(server, session, clock)
    certs.get()
    server.status = 500
    clock.advance(61)
    # THEN neither reading the set nor a known key id gets the expired set
    with pytest.raises(CertsUnavailableError):
        certs.get()
    clock.advance(10)
    with pytest.raises(CertsUnavailableError):
        certs.get_for(issuers[0].keys[0].kid)


def test_a_failed_refetch_for_an_unknown_key_id_is_retryable(
    server: CertsServer, session: requests.Session, clock: FakeClock, issuers: tuple[TokenIssuer, TokenIssuer]
) -> None:
    # GIVEN a cached set, and the server failing when a new key id comes
    server.serve(issuers[0].certs())
    certs = make_certs(server, session, clock)
    certs.get()
    server.status = 502
    clock.advance(120)
    # WHEN the new key id comes, and again 30 s later (within the throttle)
    with pytest.raises(CertsUnavailableError):
        certs.get_for("new-key-id")
    clock.advance(30)
    with pytest.raises(CertsUnavailableError):
        certs.get_for("new-key-id")
    # THEN both are retryable, the second sent nothing, and known keys still verify from the cache
    assert server.requests == 2
    assert certs.get_for(issuers[0].keys[0].kid) == issuers[0].certs()


@pytest.mark.parametrize(
    "body",
    [
        b"<html>not json</html>",
        b"[]",
        b"{}",
        b'{"kid": 1}',
        b'{"kid": "no certificate here"}',
        b'{"kid": "-----BEGIN CERTIFICATE-----' + b"A" * (1 << 20) + b'"}',
    ],
)
def test_a_document_that_is_not_a_certificate_set_is_retryable(
    server: CertsServer, session: requests.Session, clock: FakeClock, body: bytes
) -> None:
    server.body = body
    with pytest.raises(CertsUnavailableError):
        make_certs(server, session, clock).get()


def test_an_unreachable_server_is_retryable(session: requests.Session, clock: FakeClock) -> None:
    # GIVEN a port nothing listens on (a server started and stopped)
    gone = CertsServer()
    gone.start()
    gone.stop()
    # THEN the fetch fails as retryable
    with pytest.raises(CertsUnavailableError, match="cannot fetch"):
        GoogleCerts(session, gone.url, timeout=2.0, clock=clock.monotonic).get()
