"""What a token says once its signature verified: its times against the moment the message was
accepted, and the VM its `google.compute_engine` claims name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from functions.trust.gce_token.errors import TokenError, TokenExpiredError

ISSUERS = frozenset({"https://accounts.google.com", "accounts.google.com"})  # the documented forms
CLOCK_SKEW = timedelta(seconds=30)
_REQUIRED_FIELDS = ("instance_name", "instance_id", "project_id", "zone")


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


def times(payload: Mapping[str, Any], valid_at: datetime) -> tuple[datetime, datetime]:
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
            f"the token was issued at {iso(issued_at)}, after the message was accepted at {iso(valid_at)}: "
            "a token attached to a message must be older than it; check the sender's clock and the bus's time"
        )
    if moment > exp + skew:
        raise TokenExpiredError(
            f"the token expired at {iso(expires_at)}, before the message was accepted at {iso(valid_at)}: "
            "the sender must attach a fresh token (they last one hour)"
        )
    return issued_at, expires_at


def compute_engine(payload: Mapping[str, Any]) -> dict[str, str]:
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


def aware(moment: datetime, name: str) -> datetime:
    if moment.tzinfo is None:
        raise TokenError(f"{name} must be an aware datetime (UTC), not a naive one")
    return moment


def iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
