"""Timestamp formats on the wire: RFC 3339 (envelopes) and RFC 1123 (Azure NotBefore).

Written by hand because Python 3.9's `datetime.fromisoformat` rejects the trailing
"Z" that every cloud API sends.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)
# ISO 8601 without a zone, as some IMDS emulators print NotBefore ("2016-09-19T18:29:47").
_ISO8601_NAIVE = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?$")


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 timestamp into an aware UTC datetime.

    Raises:
        ValueError: the text is not RFC 3339 with a time zone.
    """
    match = _RFC3339.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not an RFC 3339 timestamp such as 2022-04-11T22:26:58Z")
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    micros = int((fraction or "0")[:6].ljust(6, "0"))
    offset = timedelta(0)
    if not zulu:
        offset = timedelta(hours=int(off_h), minutes=int(off_m))
        if sign == "-":
            offset = -offset
    try:
        local = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            micros,
            tzinfo=timezone(offset),
        )
        return local.astimezone(timezone.utc)
    except ValueError as exc:  # e.g. month 13: the shape matched but the date does not exist
        raise ValueError(f"{text!r} is not an RFC 3339 timestamp: {exc}") from exc
    except OverflowError as exc:  # a valid local time whose UTC falls outside years 1-9999
        raise ValueError(f"{text!r} is outside the years 1-9999 once in UTC") from exc


def format_rfc3339(moment: datetime) -> str:
    """Format an aware datetime as RFC 3339 UTC, with milliseconds only when present."""
    if moment.tzinfo is None:
        raise ValueError("refusing a naive datetime: pass an aware one (UTC)")
    utc = moment.astimezone(timezone.utc)
    # Formatted by hand, not strftime: a third of the cost (every audit line and envelope carries
    # timestamps), and the year always has four digits (glibc's %Y gives "5", not "0005").
    text = f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}"
    if utc.microsecond:
        return f"{text}.{utc.microsecond // 1000:03d}Z"
    return text + "Z"


def parse_rfc1123(text: str) -> datetime:
    """Parse Azure's NotBefore ("Mon, 11 Apr 2022 22:26:58 GMT") into aware UTC.

    Raises:
        ValueError: the text is not an RFC 1123 date.
    """
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError) as exc:  # Python 3.9 raises TypeError
        raise ValueError(f"{text!r} is not an RFC 1123 date such as 'Mon, 11 Apr 2022 22:26:58 GMT'") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    try:
        return moment.astimezone(timezone.utc)
    except OverflowError as exc:  # a valid local time whose UTC falls outside years 1-9999
        raise ValueError(f"{text!r} is outside the years 1-9999 once in UTC") from exc


def format_rfc1123(moment: datetime) -> str:
    """Format an aware datetime the way Azure IMDS prints NotBefore."""
    if moment.tzinfo is None:
        raise ValueError("refusing a naive datetime: pass an aware one (UTC)")
    return moment.astimezone(timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT")


def parse_not_before(text: str) -> datetime:
    """Parse a NotBefore as Azure prints it (RFC 1123) or as some IMDS emulators do (ISO 8601 /
    RFC 3339; without a zone it is taken as UTC, the zone Azure's NotBefore is always in).

    Raises:
        ValueError: the text is none of these.
    """
    stripped = text.strip()
    if _ISO8601_NAIVE.match(stripped):
        stripped += "Z"
    if stripped[:4].isdigit():
        return parse_rfc3339(stripped)
    try:
        return parse_rfc1123(stripped)
    except ValueError:
        raise ValueError(
            f"{text[:80]!r} is neither an RFC 1123 date ('Mon, 11 Apr 2022 22:26:58 GMT') "
            "nor an ISO 8601 time ('2022-04-11T22:26:58Z')"
        ) from None
