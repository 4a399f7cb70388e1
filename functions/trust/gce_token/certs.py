"""Where the trusted certificates come from: a fixed set (tests, the simulator's trust file) or
Google's, fetched and cached as the response's Cache-Control says.

Both give key id → PEM certificate, the shape of Google's v1 certs.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Protocol

import requests

from functions.trust.gce_token.errors import CertsUnavailableError, TokenError

GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"

# The cache lifetime of a certificate set comes from Cache-Control max-age, within these bounds.
MIN_CACHE_SECONDS = 60.0
MAX_CACHE_SECONDS = 24 * 3600.0
UNKNOWN_KID_INTERVAL = 60.0  # an unknown key id refetches the set at most this often
FAILED_FETCH_INTERVAL = 5.0  # after a failed fetch, callers get the same error this long
MAX_CERTS_BYTES = 1 << 20
FETCH_TIMEOUT = 10.0

_CERT_MARKER = "-----BEGIN CERTIFICATE-----"
_SECONDS = re.compile(r"[0-9]{1,12}")


class CertSource(Protocol):
    """Where the trusted certificates come from."""

    def get(self) -> Mapping[str, str]:
        """The current set, key id → PEM certificate."""
        ...

    def get_for(self, kid: str) -> Mapping[str, str]:
        """The current set, refreshed first if it lacks `kid` and the source can refresh."""
        ...


class StaticCerts:
    """A fixed certificate set: tests, and the simulator's trust file."""

    def __init__(self, certs: Mapping[str, str]) -> None:
        self._certs = _checked_certs(certs, "the given certificates", TokenError)

    @classmethod
    def from_file(cls, path: str | Path) -> StaticCerts:
        """A JSON object of key id → PEM certificate, as Google's v1 certs or the simulator write it."""
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TokenError(f"cannot read the trusted certificates from {path}: {exc}") from exc
        return cls(document)

    def get(self) -> Mapping[str, str]:
        return self._certs

    def get_for(self, kid: str) -> Mapping[str, str]:
        return self._certs


class GoogleCerts:
    """Google's certificates, fetched with `session` and cached as the response's Cache-Control says.

    The cache lasts max-age (less Age) bounded to [60 s, 24 h]. A token signed with a key id the
    cached set lacks refetches it once (at most once a minute: a stream of made-up key ids costs one
    request a minute). A fetch that fails raises `CertsUnavailableError`, and for
    `FAILED_FETCH_INTERVAL` seconds after it callers get the same error without a new request; a
    set past its lifetime is never used.
    """

    def __init__(
        self,
        session: requests.Session,
        url: str = GOOGLE_CERTS_URL,
        *,
        timeout: float = FETCH_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._session = session
        self._url = url
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._certs: dict[str, str] = {}
        self._expires = -math.inf
        self._fetched_at = -math.inf  # last attempt, successful or not
        self._failure: CertsUnavailableError | None = None  # the last attempt's error, if it failed

    def get(self) -> Mapping[str, str]:
        with self._lock:
            if self._clock() >= self._expires:
                self._fetch()
            return self._certs

    def get_for(self, kid: str) -> Mapping[str, str]:
        with self._lock:
            now = self._clock()
            if now >= self._expires or (kid not in self._certs and now - self._fetched_at >= UNKNOWN_KID_INTERVAL):
                self._fetch()
            elif kid not in self._certs and self._failure is not None:
                raise self._failure  # the key may be new, and the last attempt to learn it failed
            return self._certs

    def _fetch(self) -> None:
        now = self._clock()
        if self._failure is not None and now - self._fetched_at < FAILED_FETCH_INTERVAL:
            raise self._failure
        self._fetched_at = now
        try:
            certs, lifetime = self._download()
        except CertsUnavailableError as exc:
            self._failure = exc
            raise
        self._failure = None
        self._certs = certs
        self._expires = now + lifetime

    def _download(self) -> tuple[dict[str, str], float]:
        try:
            with self._session.get(self._url, timeout=self._timeout, stream=True) as response:
                body = _read_bounded(response)
                status = response.status_code
                cache_control = response.headers.get("Cache-Control", "")
                age = response.headers.get("Age", "")
        except requests.RequestException as exc:
            raise CertsUnavailableError(f"cannot fetch the certificates from {self._url}: {exc}") from exc
        if status != 200:
            raise CertsUnavailableError(f"{self._url} answered HTTP {status}; retry later")
        try:
            document = json.loads(body)
        except ValueError as exc:
            raise CertsUnavailableError(f"{self._url} answered something that is not JSON: {exc}") from exc
        certs = _checked_certs(document, self._url, CertsUnavailableError)
        return certs, cache_lifetime(cache_control, age)


def cache_lifetime(cache_control: str, age: str = "") -> float:
    """Seconds a response may be cached: max-age less Age, bounded to [60 s, 24 h] (60 s without one)."""
    max_age: float | None = None
    for directive in cache_control.split(","):
        name, _, value = directive.strip().partition("=")
        if name.strip().lower() == "max-age" and _SECONDS.fullmatch(value.strip()):
            max_age = float(value.strip())
    if max_age is None:
        return MIN_CACHE_SECONDS
    if _SECONDS.fullmatch(age.strip()):
        max_age -= float(age.strip())
    return min(max(max_age, MIN_CACHE_SECONDS), MAX_CACHE_SECONDS)


def _checked_certs(document: object, where: str, error: type[Exception]) -> dict[str, str]:
    if not isinstance(document, Mapping) or not document:
        raise error(f"{where}: expected a non-empty JSON object of key id to PEM certificate")
    certs: dict[str, str] = {}
    for kid, pem in document.items():
        if not isinstance(kid, str) or not isinstance(pem, str) or _CERT_MARKER not in pem:
            raise error(f"{where}: key {kid!r} does not map a key id to a PEM certificate")
        certs[kid] = pem
    return certs


def _read_bounded(response: requests.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_content(chunk_size=64 * 1024):
        size += len(chunk)
        if size > MAX_CERTS_BYTES:
            raise CertsUnavailableError(f"the certificate set is over {MAX_CERTS_BYTES} bytes: not Google's")
        chunks.append(chunk)
    return b"".join(chunks)
