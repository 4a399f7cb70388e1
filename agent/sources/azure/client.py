"""Azure IMDS: Scheduled Events client and poller (docs/agent.md#what-it-does-and-why-you-can-trust-it).

The client speaks the documented API: `Metadata: true` on every call, an explicit
api-version, StartRequests POSTs. The poller reads the document once per interval
(1 s by default, as the docs recommend), backs off with jitter on 429/5xx/timeouts,
tolerates the first call taking up to two minutes (Scheduled Events is enabled by
that first call), and hands a document on only when its DocumentIncarnation changed.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from agent import logs
from agent.sources.azure.document import ScheduledEventsDocument, parse_scheduled_events
from agent.sources.http import MetadataHttp, MetadataUnavailableError
from agent.timing import Backoff, Clock, RateLimiter
from wire.errors import MalformedDocumentError, PermanentError
from wire.model import Cloud

LOGGER = logging.getLogger("mbridge.azure")

DEFAULT_BASE_URL = "http://169.254.169.254"
SCHEDULED_EVENTS_PATH = "/metadata/scheduledevents"
NAME_PATH = "/metadata/instance/compute/name"
ATTESTED_PATH = "/metadata/attested/document"
# The attested document's api-version: the first whose document carries timeStamp and vmId as they
# are read today.
ATTESTED_API_VERSION = "2020-09-01"
API_VERSION = "2020-07-01"
# The generally available versions the Scheduled Events docs list (2017-03-01 was a preview). The
# newest is the default; an older one serves clouds whose docs stop earlier (the Azure China docs
# list 2019-08-01 as newest). Older versions leave out fields, which the parser takes as absent:
# EventSource came with 2019-08-01, Description with 2019-04-01, DurationInSeconds with 2020-07-01.
API_VERSIONS = ("2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01", "2020-07-01")
INSTANCE_API_VERSION = "2021-02-01"
HEADERS = {"Metadata": "true"}
# IMDS allows 5 requests/s per VM, shared with other IMDS users on it: keep a margin.
REQUESTS_PER_SECOND = 4
# Polling faster than twice a second, the polls alone take up to 4 of those: the agent then allows
# itself IMDS's whole 5, so that an approval or a proof never waits for a poll's slot to free.
FAST_POLL_INTERVAL = 0.5
FAST_REQUESTS_PER_SECOND = 5
# IMDS counts the requests of a second as they arrive, the agent as it sends them: at its limit, a
# window of exactly one second here is one IMDS sees shorter whenever the first request of it took
# longer on its way than the last, and that request is refused (429, then a backoff of a second or
# more: a state of the event can go by unseen). The agent's window is longer by this margin.
IMDS_WINDOW_SECONDS = 1.1


def requests_per_second(poll_interval: float) -> int:
    """How many IMDS requests the agent allows itself in any second at `poll_interval`."""
    return FAST_REQUESTS_PER_SECOND if poll_interval < FAST_POLL_INTERVAL else REQUESTS_PER_SECOND


# "You should expect a delayed response in your first call of up to two minutes."
FIRST_CALL_TIMEOUT = (2.0, 130.0)
# IMDS throttles per second, and the shortest notice is 30 s (Preempt): backing off longer than
# a few seconds would trade a refused request for a missed event.
MAX_BACKOFF = 5.0


class ApprovalRefusedError(PermanentError):
    """IMDS answered 400 to a StartRequests POST: the docs give 400 only for a malformed header or
    payload. (A well-formed POST naming an EventId IMDS no longer lists is answered 200; the agent
    re-reads the document just before it POSTs, so only an event removed in between gets one.)"""


@dataclass(frozen=True)
class AzureObservation:
    """A document whose incarnation differs from the previous one, and when it was seen.

    `lag_bound` is the longest the change can have been visible before the agent saw it:
    the time since the previous successful read.
    """

    document: ScheduledEventsDocument
    observed_at: datetime
    lag_bound: float


class AzureImdsClient:
    def __init__(self, http: MetadataHttp, api_version: str = API_VERSION) -> None:
        self._http = http
        self._params = {"api-version": api_version}

    @classmethod
    def for_base_url(
        cls, base_url: str, api_version: str = API_VERSION, per_second: int = REQUESTS_PER_SECOND
    ) -> AzureImdsClient:
        limiter = RateLimiter(per_second, window=IMDS_WINDOW_SECONDS)
        return cls(MetadataHttp(base_url, HEADERS, limiter=limiter), api_version)

    @property
    def base_url(self) -> str:
        return self._http.base_url

    def fetch_document(self, *, first_call: bool = False) -> ScheduledEventsDocument:
        """GET the Scheduled Events document.

        Raises:
            MetadataUnavailableError: throttled, server error, timeout, or a body that does not parse
                (kind "malformed"): keep the previous state and retry.
        """
        timeout = FIRST_CALL_TIMEOUT if first_call else (2.0, 10.0)
        response = self._http.get(SCHEDULED_EVENTS_PATH, self._params, timeout=timeout)
        if response.status_code != 200:
            raise MetadataUnavailableError(
                "client_error",
                f"GET scheduledevents answered {response.status_code}: {response.text.strip()[:200]}",
                response.status_code,
            )
        try:
            return parse_scheduled_events(response.content)
        except MalformedDocumentError as exc:
            raise MetadataUnavailableError("malformed", str(exc)) from exc

    def post_approval(self, event_id: str) -> None:
        """POST {"StartRequests": [{"EventId": event_id}]}. 200 is success, also when the event
        was already approved or started (the docs: "always returns a 200 ... for a valid event ID").

        Raises:
            ApprovalRefusedError: 400 — the request header or payload was malformed.
            MetadataUnavailableError: transient; the caller decides whether to retry.
        """
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode("utf-8")
        response = self._http.post(SCHEDULED_EVENTS_PATH, self._params, body)
        if response.status_code == 200:
            return
        if response.status_code == 400:
            raise ApprovalRefusedError(f"IMDS refused the approval of {event_id}: {response.text.strip()[:200]}")
        raise MetadataUnavailableError(
            "client_error", f"POST scheduledevents answered {response.status_code}", response.status_code
        )

    def attested_document(self, nonce: str) -> str:
        """The `signature` of the attested document for `nonce` (base64 PKCS#7, signed by Azure).

        Raises:
            MetadataUnavailableError: any answer but a 200 with a PKCS#7 signature; retry later.
        """
        params = {"api-version": ATTESTED_API_VERSION, "nonce": nonce}
        response = self._http.get(ATTESTED_PATH, params, timeout=(2.0, 10.0))
        if response.status_code != 200:
            raise MetadataUnavailableError(
                "client_error",
                f"GET attested/document answered {response.status_code}: {response.text.strip()[:200]}",
                response.status_code,
            )
        try:
            answer = json.loads(response.content)
        except ValueError as exc:
            raise MetadataUnavailableError("malformed", f"attested/document is not JSON: {exc}") from exc
        signature = answer.get("signature") if isinstance(answer, dict) else None
        if not isinstance(signature, str) or not signature or answer.get("encoding") != "pkcs7":
            raise MetadataUnavailableError("malformed", "attested/document has no pkcs7 signature")
        return signature

    def own_name(self) -> str:
        """This VM's name exactly as IMDS reports it (what Resources contains)."""
        response = self._http.get(NAME_PATH, {"api-version": INSTANCE_API_VERSION, "format": "text"})
        name = response.text.strip()
        if response.status_code != 200 or not name:
            raise MetadataUnavailableError(
                "client_error",
                f"GET compute/name answered {response.status_code}; pass --vm-name to set the name explicitly",
                response.status_code,
            )
        return name

    def close(self) -> None:
        self._http.close()


class AzurePoller:
    """Polls until stopped; calls `emit` for each document with a new incarnation."""

    def __init__(
        self,
        client: AzureImdsClient,
        emit: Callable[[AzureObservation], None],
        *,
        clock: Clock,
        interval: float = 1.0,
        backoff: Backoff | None = None,
        on_poll: Callable[[str, str | None], None] = lambda result, kind: None,
    ) -> None:
        self._client = client
        self._emit = emit
        self._clock = clock
        self._interval = interval
        self._backoff = backoff or Backoff(initial=max(interval, 0.5), maximum=MAX_BACKOFF)
        self._on_poll = on_poll
        self._incarnation: int | None = None
        self._last_ok: float | None = None

    def run(self, stop: threading.Event) -> None:
        first = True
        while not stop.is_set():
            started = self._clock.monotonic()
            try:
                self.poll_once(first_call=first)
                first = False
                self._backoff.reset()
            except MetadataUnavailableError as exc:
                delay = self._backoff.next_delay()
                self._on_poll("error", exc.kind)
                LOGGER.warning(
                    "scheduled events poll failed (%s), retrying in %.1f s: %s",
                    exc.kind,
                    delay,
                    exc,
                    extra=logs.fields(cloud=Cloud.AZURE.value),
                )
                stop.wait(delay)
                continue
            # At a fixed rate: a poll starts one interval after the last one started, so the request's
            # own time does not stretch the period (and a change waits at most one interval).
            stop.wait(max(0.0, started + self._interval - self._clock.monotonic()))

    def poll_once(self, *, first_call: bool = False) -> AzureObservation | None:
        """One GET; returns (and emits) the observation when the incarnation changed."""
        document = self._client.fetch_document(first_call=first_call)
        now = self._clock.monotonic()
        lag = 0.0 if self._last_ok is None else now - self._last_ok
        self._last_ok = now
        if document.incarnation == self._incarnation:
            self._on_poll("unchanged", None)
            return None
        self._incarnation = document.incarnation
        self._on_poll("changed", None)
        observation = AzureObservation(document=document, observed_at=self._clock.now(), lag_bound=lag)
        self._emit(observation)
        return observation
