"""GCE metadata: long-poll watchers for maintenance-event, upcoming-maintenance and preempted.

Each key has its own watcher thread (docs/agent.md#what-it-does-and-why-you-can-trust-it): a direct GET
first, then
`wait_for_change=true&last_etag=...&timeout_sec=...` in a loop, so a change is seen the
moment the metadata server announces it. After every change of `maintenance-event`
the key is also read directly once more: GCE only gives the 60-second warning to VMs
that queried that key (not a parent directory) since the last maintenance event.
503 (seen during maintenance, for under a second) and other failures are retried after 0.2 s,
then with jittered backoff;
404 means the key is absent, which is a value, not an error. A value that does not parse is
a failure too, not a reading: the watcher reads again instead of long-polling on its ETag,
which would hide the change it carried until the long-poll times out. A long-poll that comes
back unchanged within a second (a server or proxy that does not hold it) is followed by the
next one a full second after that answer, so the watchers cannot spin; a change, and the direct
re-read after it, are never held back.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from agent import logs
from agent.sources.gce.values import parse_maintenance_event, parse_preempted, parse_upcoming_maintenance
from agent.sources.http import MetadataHttp, MetadataUnavailableError
from agent.timing import Backoff, Clock
from wire.errors import MalformedDocumentError
from wire.gce_ids import MAINTENANCE_EVENT_KEY, PREEMPTED_KEY, UPCOMING_MAINTENANCE_KEY
from wire.model import Cloud

LOGGER = logging.getLogger("mbridge.gce")

DEFAULT_BASE_URL = "http://metadata.google.internal"
PREFIX = "/computeMetadata/v1/instance/"
HEADERS = {"Metadata-Flavor": "Google"}
IDENTITY_KEY = "service-accounts/default/identity"
# The server holds a long-poll up to timeout_sec; the read timeout leaves it room to answer.
LONG_POLL_SECONDS = 60
# A long-poll is held by the server until a change or its timeout; one that comes back unchanged
# sooner than this waits this long after its answer before the next. Counted from the answer, not
# the request: the gap between two requests is then more than a second wherever it is measured
# (network jitter cannot squeeze two into one second), so three watchers send at most 3 a second.
MIN_UNCHANGED_LONG_POLL_SECONDS = 1.0
# The first read again after a failure (see GceKeyWatcher.delay_after_failure).
FIRST_RETRY_SECONDS = 0.2
# GCE instance ids are unsigned 64-bit integers in decimal. Every GCE event id is derived from it,
# so a garbled answer must never become the identity.
_INSTANCE_ID = re.compile(r"^[0-9]{1,20}$")
# Each watched key's parser: an answer it refuses is retried, never kept as the key's reading.
VALUE_PARSERS: dict[str, Callable[[str], object]] = {
    MAINTENANCE_EVENT_KEY: parse_maintenance_event,
    UPCOMING_MAINTENANCE_KEY: parse_upcoming_maintenance,
    PREEMPTED_KEY: parse_preempted,
}


@dataclass(frozen=True)
class GceReading:
    """One answer for one key: its text (None when absent) and ETag."""

    key: str
    value: str | None
    etag: str


@dataclass(frozen=True)
class GceObservation:
    """A key's value changed (or was read for the first time).

    `lag_bound` is the longest the change can have been visible before the agent saw it:
    the gap between the previous answer and the request that returned it (near zero while
    a long-poll is waiting, which is the point of long-polling).
    """

    reading: GceReading
    observed_at: datetime
    lag_bound: float


class GceMetadataClient:
    def __init__(self, http: MetadataHttp) -> None:
        self._http = http

    @classmethod
    def for_base_url(cls, base_url: str) -> GceMetadataClient:
        return cls(MetadataHttp(base_url, HEADERS))

    @property
    def base_url(self) -> str:
        return self._http.base_url

    def read(self, key: str, *, wait: bool = False, last_etag: str | None = None) -> GceReading:
        """GET instance/<key>, directly or as a long-poll.

        Raises:
            MetadataUnavailableError: 503 during maintenance, other errors, timeouts.
        """
        params = {}
        timeout = (2.0, 10.0)
        if wait:
            params = {"wait_for_change": "true", "timeout_sec": str(LONG_POLL_SECONDS)}
            if last_etag:
                params["last_etag"] = last_etag
            timeout = (2.0, LONG_POLL_SECONDS + 10.0)
        response = self._http.get(PREFIX + key, params, timeout=timeout)
        etag = response.headers.get("ETag", "")
        if response.status_code == 404:
            return GceReading(key=key, value=None, etag=etag)
        if response.status_code != 200:
            raise MetadataUnavailableError(
                "client_error", f"GET {key} answered {response.status_code}", response.status_code
            )
        return GceReading(key=key, value=response.text, etag=etag)

    def identity_token(self, audience: str) -> str:
        """A Google-signed instance identity token for `audience`, with the instance's details
        (format=full), without license codes.

        Raises:
            MetadataUnavailableError: any answer but a 200 with a token; retry later.
        """
        params = {"audience": audience, "format": "full", "licenses": "FALSE"}
        response = self._http.get(PREFIX + IDENTITY_KEY, params, timeout=(2.0, 10.0))
        token = response.text.strip()
        if response.status_code != 200 or token.count(".") != 2:
            raise MetadataUnavailableError(
                "client_error",
                f"GET {IDENTITY_KEY} answered {response.status_code}: {token[:200]}",
                response.status_code,
            )
        return token

    def own_name(self) -> str:
        return self._identity("name")

    def instance_id(self) -> str:
        """instance/id, checked to be a decimal integer.

        Raises:
            MetadataUnavailableError: absent, or not a decimal integer (a garbled answer); retry.
        """
        value = self._identity("id")
        if not _INSTANCE_ID.match(value):
            raise MetadataUnavailableError("malformed", f"instance/id answered {value[:40]!r}, not a decimal id")
        return value

    def _identity(self, key: str) -> str:
        reading = self.read(key)
        if not reading.value or not reading.value.strip():
            raise MetadataUnavailableError(
                "client_error", f"instance/{key} is absent; pass --vm-name to set the name explicitly"
            )
        return reading.value.strip()

    def close(self) -> None:
        self._http.close()


class GceKeyWatcher:
    """Watches one key until stopped; calls `emit` for the first reading and every change."""

    def __init__(
        self,
        client: GceMetadataClient,
        key: str,
        emit: Callable[[GceObservation], None],
        *,
        clock: Clock,
        backoff: Backoff | None = None,
        on_poll: Callable[[str, str | None], None] = lambda result, kind: None,
    ) -> None:
        self._client = client
        self.key = key
        self._emit = emit
        self._clock = clock
        # Capped low: a live migration is announced only 60 s ahead.
        self._backoff = backoff or Backoff(initial=0.5, maximum=5.0)
        self._failures = 0
        self._on_poll = on_poll
        self._last: GceReading | None = None
        self._last_answer_at: float | None = None

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            # Until the first answer, read directly; afterwards long-poll on the ETag.
            wait = self._last is not None
            asked_at = self._clock.monotonic()
            try:
                observation = self.step(wait=wait)
                self._failures = 0
                self._backoff.reset()
            except MetadataUnavailableError as exc:
                delay = self.delay_after_failure()
                self._on_poll("error", exc.kind)
                LOGGER.warning(
                    "reading %s failed (%s), retrying in %.1f s: %s",
                    self.key,
                    exc.kind,
                    delay,
                    exc,
                    extra=logs.fields(cloud=Cloud.GCE.value),
                )
                stop.wait(delay)
                continue
            if wait and observation is None:
                stop.wait(self.pause_after_unchanged(asked_at))

    def delay_after_failure(self) -> float:
        """How long to wait before reading again after a failed read. The metadata server answers
        503 while the VM's own maintenance goes on, for under a second: the first retry goes out
        after FIRST_RETRY_SECONDS, so the change it hides is seen within a second of a 60-second
        notice; only a failure that persists backs off (jittered, capped)."""
        self._failures += 1
        return FIRST_RETRY_SECONDS if self._failures == 1 else self._backoff.next_delay()

    def pause_after_unchanged(self, asked_at: float) -> float:
        """Seconds to wait before the next long-poll after one that came back unchanged."""
        held = self._clock.monotonic() - asked_at
        return MIN_UNCHANGED_LONG_POLL_SECONDS if held < MIN_UNCHANGED_LONG_POLL_SECONDS else 0.0

    def step(self, *, wait: bool) -> GceObservation | None:
        """One request; returns (and emits) an observation when the value changed."""
        asked_at = self._clock.monotonic()
        reading = self._client.read(self.key, wait=wait, last_etag=self._last.etag if self._last else None)
        answered_at = self._clock.monotonic()
        gap = 0.0 if self._last_answer_at is None else max(0.0, asked_at - self._last_answer_at)
        self._last_answer_at = answered_at
        self._check_parses(reading)
        changed = self._last is None or reading.value != self._last.value
        self._last = reading
        if not changed:
            self._on_poll("unchanged", None)
            return None
        self._on_poll("changed", None)
        observation = GceObservation(reading=reading, observed_at=self._clock.now(), lag_bound=gap)
        self._emit(observation)
        if self.key == MAINTENANCE_EVENT_KEY and wait:
            # A direct query after every event, so GCE keeps sending the 60-second warning.
            self._client.read(self.key)
        return observation

    def _check_parses(self, reading: GceReading) -> None:
        parse = VALUE_PARSERS.get(self.key)
        if parse is None or reading.value is None:
            return
        try:
            parse(reading.value)
        except MalformedDocumentError as exc:
            message = f"{self.key} answered a value that does not parse: {exc}"
            raise MetadataUnavailableError("malformed", message) from exc
