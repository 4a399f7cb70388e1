"""Wire timestamps: RFC 3339 for envelopes, RFC 1123 for Azure NotBefore."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from wire.timefmt import format_rfc1123, format_rfc3339, parse_rfc1123, parse_rfc3339

UTC = timezone.utc


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2022-04-11T22:26:58Z", datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC)),
        ("2022-04-11t22:26:58z", datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC)),
        ("2022-04-11T22:26:58.5Z", datetime(2022, 4, 11, 22, 26, 58, 500000, tzinfo=UTC)),
        ("2022-04-11T22:26:58.123456789Z", datetime(2022, 4, 11, 22, 26, 58, 123456, tzinfo=UTC)),
        ("2022-04-12T00:26:58+02:00", datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC)),
        ("2022-04-11T20:56:58-01:30", datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC)),
    ],
)
def test_rfc3339_is_parsed_to_utc(text: str, expected: datetime) -> None:
    parsed = parse_rfc3339(text)
    assert parsed == expected
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize("text", ["", "2022-04-11", "2022-04-11T22:26:58", "yesterday", "2022-13-01T00:00:00Z"])
def test_rfc3339_without_zone_or_date_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_rfc3339(text)


def test_rfc3339_formatting_is_utc_with_optional_milliseconds() -> None:
    assert format_rfc3339(datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC)) == "2022-04-11T22:26:58Z"
    assert format_rfc3339(datetime(2022, 4, 11, 22, 26, 58, 250000, tzinfo=UTC)) == "2022-04-11T22:26:58.250Z"
    assert format_rfc3339(datetime(2022, 4, 11, 22, 26, 58, 999, tzinfo=UTC)) == "2022-04-11T22:26:58.000Z"
    assert format_rfc3339(datetime(5, 1, 2, 3, 4, 5, tzinfo=UTC)) == "0005-01-02T03:04:05Z"  # four-digit year
    plus_two = timezone(timedelta(hours=2))
    assert format_rfc3339(datetime(2022, 4, 12, 0, 26, 58, tzinfo=plus_two)) == "2022-04-11T22:26:58Z"
    with pytest.raises(ValueError, match="naive"):
        format_rfc3339(datetime(2022, 4, 11))  # naive on purpose


def test_azure_not_before_round_trips() -> None:
    moment = parse_rfc1123("Mon, 11 Apr 2022 22:26:58 GMT")
    assert moment == datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC)
    assert format_rfc1123(moment) == "Mon, 11 Apr 2022 22:26:58 GMT"


@pytest.mark.parametrize("text", ["", "soon", "2022-04-11T22:26:58Z"])
def test_bad_not_before_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="RFC 1123"):
        parse_rfc1123(text)


@pytest.mark.parametrize("text", ["9999-12-31T23:59:59-00:01", "0001-01-01T00:00:00+00:01"])
def test_rfc3339_outside_the_calendar_once_in_utc_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="outside the years 1-9999"):
        parse_rfc3339(text)


@pytest.mark.parametrize("text", ["Fri, 31 Dec 9999 23:59:59 -0001", "Fri, 31 Dec 9999 23:30:00 -0100"])
def test_rfc1123_outside_the_calendar_once_in_utc_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="outside the years 1-9999"):
        parse_rfc1123(text)
