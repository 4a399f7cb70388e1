"""GCE instance identity tokens: check that a token was signed by Google for this audience and say
which VM it names.

A token is an RS256 JWT that the metadata server issues to the VM that asks
(compute/docs/instances/verifying-instance-identity). Google's public keys are x509 certificates
by key id at https://www.googleapis.com/oauth2/v1/certs (`GoogleCerts` fetches and caches them;
`StaticCerts` holds a fixed set, such as the simulator's). The signature, the audience and the
times are checked by google-auth (`google.auth.jwt.decode`); this module adds the size bound, the
issuer, the algorithm, the `google.compute_engine` claims and the project.

Time. A message may be verified long after it was published (a backlog on the bus), and a token
lasts one hour. What matters is that the token was valid when the bus accepted the message
(`valid_at`), not that it still is. google-auth checks `iat` and `exp` against the system clock
with a skew, so its skew is widened by the backlog (`now - valid_at`) plus twice `CLOCK_SKEW`; then
`iat` and `exp` are checked against `valid_at` with `CLOCK_SKEW` (30 s). With `now` on the system
clock, google-auth's window is the same one a skew wider, so the check against `valid_at` decides;
when google-auth refuses first, the (then authentic) claims are checked against `valid_at` to say
which bound failed.

Every refusal raises `TokenError` with what failed and what to check. A certificate set that cannot
be fetched raises `CertsUnavailableError` instead, a `RetryableError`: the message should be tried
again later, not refused.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Protocol

import requests
from google.auth import jwt

from wire.errors import RetryableError

GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
ISSUERS = frozenset({"https://accounts.google.com", "accounts.google.com"})  # the documented forms
ALGORITHM = "RS256"
MAX_TOKEN_BYTES = 16 * 1024  # tokens are about 1 KiB; anything this large is not one
CLOCK_SKEW = timedelta(seconds=30)

# The cache lifetime of a certificate set comes from Cache-Control max-age, within these bounds.
MIN_CACHE_SECONDS = 60.0
MAX_CACHE_SECONDS = 24 * 3600.0
UNKNOWN_KID_INTERVAL = 60.0  # an unknown key id refetches the set at most this often
FAILED_FETCH_INTERVAL = 5.0  # after a failed fetch, callers get the same error this long
MAX_CERTS_BYTES = 1 << 20
FETCH_TIMEOUT = 10.0

_CERT_MARKER = "-----BEGIN CERTIFICATE-----"
_SECONDS = re.compile(r"[0-9]{1,12}")
_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")
_REQUIRED_FIELDS = ("instance_name", "instance_id", "project_id", "zone")


class TokenError(ValueError):
    """The token is refused: the message says what failed and what to check."""


class CertsUnavailableError(RetryableError):
    """The certificates to verify against could not be had now; retry later, do not refuse."""


@dataclass(frozen=True)
class GceIdentity:
    """The VM a verified token names."""

    instance_name: str
    instance_id: str
    project_id: str
    zone: str
    audience: str
    issued_at: datetime
    expires_at: datetime


def verify_identity_token(
    token: str,
    *,
    certs: Mapping[str, str],
    audience: str,
    valid_at: datetime,
    now: datetime,
    allowed_projects: Collection[str] | None = None,
) -> GceIdentity:
    """The VM named by `token`, which must have been valid at `valid_at` for `audience`.

    `certs` is key id → PEM certificate (the shape of Google's v1 certs). `valid_at` is when the
    bus accepted the message; `now` is the current time on the system clock (what google-auth
    reads), at or after `valid_at`. With `allowed_projects`, the VM's project must be one of them.
    """
    _check_size(token)
    if not audience:
        raise TokenError("no audience to check the token against: configure the deployment's audience")
    if not certs:
        raise TokenError("no certificates to verify the token against: check the trusted certificate set")
    if isinstance(allowed_projects, str):
        raise TokenError("allowed_projects must be a collection of project ids, not one string")
    valid_at, now = _aware(valid_at, "valid_at"), _aware(now, "now")
    backlog = (now - valid_at).total_seconds()
    if backlog < -CLOCK_SKEW.total_seconds():
        raise TokenError(f"the message was accepted at {_iso(valid_at)}, after now ({_iso(now)}): check the clocks")
    kid = _key_id(token)
    if kid not in certs:
        raise TokenError(
            f"the token is signed with key {kid!r}, which is not among the {len(certs)} trusted certificates "
            f"({', '.join(sorted(certs))}): Google rotates its keys, so refresh the certificates "
            "(GoogleCerts does on an unknown key id); with the simulator, trust the certificates of the run that "
            "issued the token"
        )
    widened = math.ceil(max(backlog, 0.0) + 2 * CLOCK_SKEW.total_seconds())
    try:
        payload = _decode(token, certs=dict(certs), audience=audience, clock_skew_in_seconds=widened)
    except Exception as exc:  # google-auth parses untrusted input: whatever it raises is a refusal
        raise _refusal(exc, token, kid, audience, valid_at) from exc
    if not isinstance(payload, Mapping):
        raise TokenError("the token's payload is not a JSON object")
    issuer = payload.get("iss")
    if not isinstance(issuer, str) or issuer not in ISSUERS:
        raise TokenError(
            f"the token was issued by {issuer!r}, not by Google ({' or '.join(sorted(ISSUERS))}): "
            "it is not a GCE identity token"
        )
    issued_at, expires_at = _times(payload, valid_at)
    vm = _compute_engine(payload)
    if allowed_projects is not None and vm["project_id"] not in allowed_projects:
        allowed = ", ".join(sorted(allowed_projects)) or "none"
        raise TokenError(
            f"the token names a VM of project {vm['project_id']!r}, which is not allowed (allowed: {allowed}): "
            "add the project to the allowed ones, or check which project the VM runs in"
        )
    return GceIdentity(
        instance_name=vm["instance_name"],
        instance_id=vm["instance_id"],
        project_id=vm["project_id"],
        zone=vm["zone"],
        audience=audience,
        issued_at=issued_at,
        expires_at=expires_at,
    )


class CertSource(Protocol):
    """Where the trusted certificates come from."""

    def get(self) -> Mapping[str, str]:
        """The current set, key id → PEM certificate."""
        ...

    def get_for(self, kid: str) -> Mapping[str, str]:
        """The current set, refreshed first if it lacks `kid` and the source can refresh."""
        ...


def verify_with_source(
    token: str,
    *,
    source: CertSource,
    audience: str,
    valid_at: datetime,
    now: datetime,
    allowed_projects: Collection[str] | None = None,
) -> GceIdentity:
    """`verify_identity_token` with the certificates of `source`, refreshed for an unknown key id."""
    _check_size(token)
    certs = source.get_for(_key_id(token))
    return verify_identity_token(
        token, certs=certs, audience=audience, valid_at=valid_at, now=now, allowed_projects=allowed_projects
    )


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


# --------------------------------------------------------------------------- helpers

# google-auth's functions carry no annotations; these names give them the types they document.
_decode: Callable[..., Mapping[str, Any]] = jwt.decode
_decode_header: Callable[[str], Mapping[str, Any]] = jwt.decode_header


def _check_size(token: object) -> None:
    if not isinstance(token, str):
        raise TokenError(f"the identity token must be text, got {type(token).__name__}")
    if not token:
        raise TokenError("the identity token is empty: check that the sender requests one from the metadata server")
    size = len(token.encode("utf-8", "surrogatepass"))
    if size > MAX_TOKEN_BYTES:
        raise TokenError(
            f"the identity token is {size} bytes, over the {MAX_TOKEN_BYTES // 1024} KiB limit: GCE identity tokens "
            "are about 1 KiB, so this is not one; check what the sender attached"
        )


def _check_encoding(token: str) -> None:
    """Three parts of canonical unpadded base64url, so that a token has exactly one spelling.

    google-auth decodes leniently: the unused low bits of a part's last character can change without
    changing the bytes, so a signed token could be re-spelled and still verify, slipping past a
    replay check keyed on the token's text. This only compares each part with its re-encoding;
    reading the parts stays google-auth's.
    """
    parts = token.split(".")
    if len(parts) != 3 or not all(_SEGMENT.fullmatch(part) for part in parts):
        raise TokenError("the identity token is not a JWT: three base64url parts separated by dots")
    for part in parts:
        try:
            raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        except (binascii.Error, ValueError) as exc:
            raise TokenError(f"the identity token is not a JWT: a part is not base64url ({exc})") from exc
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != part:
            raise TokenError("the identity token is not canonical base64url: it was altered after signing")


def _key_id(token: str) -> str:
    """The header's key id, after checking the encoding and the algorithm (google-auth reads the header)."""
    _check_encoding(token)
    try:
        header = _decode_header(token)
    except Exception as exc:  # untrusted input: any failure to read it is a refusal
        raise TokenError(
            f"the identity token is not a JWT (three base64url parts, the first a JSON header): {exc}"
        ) from exc
    if not isinstance(header, Mapping):
        raise TokenError("the token's header is not a JSON object")
    algorithm = header.get("alg")
    if algorithm != ALGORITHM:
        raise TokenError(f"the token is signed with {algorithm!r}, not {ALGORITHM} as GCE identity tokens are")
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise TokenError("the token's header names no key id (kid), which GCE identity tokens always do")
    return kid


def _refusal(exc: Exception, token: str, kid: str, audience: str, valid_at: datetime) -> TokenError:
    text = str(exc)
    if "signature" in text:
        return TokenError(
            f"the token's signature does not verify with certificate {kid!r}: the token was altered, or signed by "
            f"a key other than the certificate's ({text})"
        )
    if "expired" in text or "too early" in text:
        # google-auth checks the times only once the signature verified: the claims are authentic,
        # so the check against valid_at can say which bound failed.
        try:
            _times(_decode(token, verify=False), valid_at)
        except TokenError as precise:
            return precise
        except Exception:  # noqa: S110 - the message below stands
            pass
        return TokenError(
            f"the token's times are off by more than the backlog from this system's clock ({text}): "
            "check the clock, and the `now` given"
        )
    if "audience" in text:
        return TokenError(
            f"the token is not for audience {audience!r} ({text}): the sender must request its token with this "
            "deployment's audience"
        )
    return TokenError(f"the token cannot be verified: {text or type(exc).__name__}")


def _times(payload: Mapping[str, Any], valid_at: datetime) -> tuple[datetime, datetime]:
    stamps = {}
    for claim in ("iat", "exp"):
        value = payload.get(claim)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TokenError(f"the token's {claim} is {value!r}, not whole seconds since the epoch")
        stamps[claim] = value
    iat, exp = stamps["iat"], stamps["exp"]
    if exp <= iat:
        raise TokenError(f"the token expires (exp {exp}) no later than it was issued (iat {iat})")
    moment = valid_at.timestamp()
    skew = CLOCK_SKEW.total_seconds()
    try:
        issued_at, expires_at = (datetime.fromtimestamp(stamp, timezone.utc) for stamp in (iat, exp))
    except (OverflowError, OSError, ValueError) as exc:
        raise TokenError(f"the token's times (iat {iat}, exp {exp}) are not usable dates: {exc}") from exc
    if moment < iat - skew:
        raise TokenError(
            f"the token was issued at {_iso(issued_at)}, after the message was accepted at {_iso(valid_at)}: "
            "a token attached to a message must be older than it; check the sender's clock and the bus's time"
        )
    if moment > exp + skew:
        raise TokenError(
            f"the token expired at {_iso(expires_at)}, before the message was accepted at {_iso(valid_at)}: "
            "the sender must attach a fresh token (they last one hour)"
        )
    return issued_at, expires_at


def _compute_engine(payload: Mapping[str, Any]) -> dict[str, str]:
    google = payload.get("google")
    details = google.get("compute_engine") if isinstance(google, Mapping) else None
    if not isinstance(details, Mapping):
        raise TokenError(
            "the token carries no google.compute_engine claims, so it names no VM: it is a standard-format "
            "token; the sender must request it with format=full"
        )
    found: dict[str, str] = {}
    for field in _REQUIRED_FIELDS:
        value = details.get(field)
        if not isinstance(value, str) or not value:
            raise TokenError(f"the token's google.compute_engine.{field} is {value!r}, not a non-empty string")
        found[field] = value
    return found


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


def _aware(moment: datetime, name: str) -> datetime:
    if moment.tzinfo is None:
        raise TokenError(f"{name} must be an aware datetime (UTC), not a naive one")
    return moment


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
