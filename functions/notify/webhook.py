"""Posting one body to a webhook, with bounded retries: `WebhookClient`.

Each post: at most 3 tries of 3 s, 0.5 s then 1 s apart (or what Retry-After asks, when that
fits), and never past 8 s in all. The queues and threads that call it are functions/notify/
notifier.py's.

The URL is a secret (Slack and Teams put the key in its path): no log line or error names more of
it than its scheme and host.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import requests

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
# Answers worth another try: the service is overloaded, throttling, or briefly broken.
_RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


class WebhookUrlError(ValueError):
    """A webhook URL that is not used: the message names its scheme and host, never its path."""


def check_url(text: str) -> str:
    """`text`, once it is an https URL with a host (http only for 127.0.0.1, localhost or ::1).

    Raises:
        WebhookUrlError: anything else.
    """
    try:
        parts = urlsplit(text.strip())
        host = (parts.hostname or "").lower()
        _ = parts.port  # raises ValueError when the port is not a number
    except ValueError:
        raise WebhookUrlError("not a URL; give the webhook's https URL") from None
    if any(character.isspace() for character in text.strip()) or not host:
        raise WebhookUrlError("not a URL with a host; give the webhook's https URL")
    if parts.scheme == "https" or (parts.scheme == "http" and host in _LOOPBACK):
        return text.strip()
    raise WebhookUrlError(
        f"the URL's scheme is {parts.scheme!r} (host {host[:100]}): give an https URL (http only for a local "
        "receiver on 127.0.0.1 or localhost)"
    )


def where(url: str) -> str:
    """What a log line may say of the URL: its scheme and host."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}"


@dataclass(frozen=True)
class RetryBounds:
    """How long one notice may take: `tries` tries of at most `try_seconds` each (to connect, and
    again for the answer), `backoff_seconds` before the second, doubled before each later one, and
    no try started (nor a Retry-After waited for) past `total_seconds`."""

    tries: int = 3
    try_seconds: float = 3.0
    total_seconds: float = 8.0
    backoff_seconds: float = 0.5


@dataclass(frozen=True)
class Delivery:
    """How posting one notice went."""

    sent: bool
    tries: int
    seconds: float
    detail: str  # the last answer, or why there was none


class WebhookClient:
    """POSTs a JSON body to the webhook, retrying 429, 5xx and connection failures within bounds.

    Redirects are not followed: a webhook that moved answers 3xx, which is reported, rather than
    the body (and the key in the URL's path) going somewhere else.
    """

    def __init__(
        self,
        url: str,
        bounds: RetryBounds | None = None,
        session: requests.Session | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url
        self.bounds = bounds or RetryBounds()
        self._session = session or requests.Session()
        self._clock = clock
        self._sleep = sleep

    def post(self, body: bytes) -> Delivery:
        bounds = self.bounds
        start = self._clock()
        wait = bounds.backoff_seconds
        detail = "not tried"
        for attempt in range(1, bounds.tries + 1):
            left = bounds.total_seconds - (self._clock() - start)
            if left <= 0:
                return Delivery(False, attempt - 1, self._clock() - start, f"{detail}; out of time")
            timeout = min(bounds.try_seconds, left)
            retry_after: float | None = None
            try:
                response = self._session.post(
                    self.url,
                    data=body,
                    headers={"Content-Type": "application/json"},
                    timeout=(timeout, timeout),
                    allow_redirects=False,
                    # The status is the answer: the body is never read, however large or slow.
                    stream=True,
                )
            except requests.Timeout:
                detail = f"no answer within {timeout:.1f} s"
            except requests.RequestException as error:
                # The exception's text quotes the whole URL: name only what kind of failure it was.
                detail = f"could not connect ({type(error).__name__})"
            else:
                status = response.status_code
                response.close()
                detail = f"HTTP {status}"
                if 200 <= status < 300:
                    return Delivery(True, attempt, self._clock() - start, detail)
                if status not in _RETRY_STATUSES:
                    return Delivery(False, attempt, self._clock() - start, detail)
                retry_after = _retry_after(response.headers.get("Retry-After"))
            if attempt == bounds.tries:
                break
            pause = wait if retry_after is None else retry_after
            left = bounds.total_seconds - (self._clock() - start)
            if pause >= left:
                reason = f"Retry-After {retry_after:g} s" if retry_after is not None else f"{pause:g} s more"
                return Delivery(False, attempt, self._clock() - start, f"{detail}; {reason} is past the bound")
            self._sleep(pause)
            wait *= 2
        return Delivery(False, bounds.tries, self._clock() - start, detail)

    def twin(self) -> WebhookClient:
        """A client like this one with a session of its own, for another thread (a requests
        Session is not made to be shared between threads)."""
        return WebhookClient(self.url, self.bounds, clock=self._clock, sleep=self._sleep)

    def close(self) -> None:
        self._session.close()


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds from now: a number of seconds, or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return max(0.0, (moment - datetime.now(timezone.utc)).total_seconds())
