"""The control plane's path for the local function host: the simulator's central feed, read as an
Event Grid subscription would deliver it, and the sweep for silent agents on a timer
(docs/architecture.md#two-paths).

The feed is `GET /_sim/central/events?after=N` of an Azure simulator (docs/simulator.md): Event
Grid `ScheduledEventEmitted` events in the order Azure emitted them, duplicates included. Each is
made into a `CentralReport` of the VMs in the deployment's scope and acted on by the core; one that
is not ours, or cannot be read, is logged and passed (a cloud queue would dead-letter it: it can
never be acted on). A transient failure leaves the read position where it is, like a platform
retry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import requests

from functions.central.event_grid import AzureScope, event_grid_report
from functions.core.central import CentralRefused, process_central, sweep_silent
from functions.core.process import Deps, Outcome
from wire.bounds import bounded
from wire.errors import RetryableError

LOGGER = logging.getLogger("mbridge.functions.local.central")

SWEEP_EVERY = timedelta(seconds=60)  # as the cloud apps' timer: once a minute


class CentralFeedReader:
    """Reads an Azure simulator's central feed into the core, and sweeps for silent agents."""

    def __init__(
        self,
        feed_url: str,
        deps: Deps,
        scope: AzureScope,
        clock: Callable[[], datetime],
        *,
        sweep_every: timedelta = SWEEP_EVERY,
        on_outcome: Callable[[Outcome], None] = lambda outcome: None,
        session: requests.Session | None = None,
    ) -> None:
        self._url = feed_url.rstrip("/") + "/_sim/central/events"
        self._deps = deps
        self._scope = scope
        self._clock = clock
        self._sweep_every = sweep_every
        self._on_outcome = on_outcome
        self._session = session or requests.Session()
        self._position = 0
        self._swept_at: datetime | None = None

    def step(self, limit: int = 100) -> int:
        """Act on what the feed has since the last step, then sweep when it is time; how many events
        were taken."""
        taken = 0
        for seq, event in self._read(limit):
            try:
                outcomes = process_central(event_grid_report(event, self._scope), self._deps, self._clock())
            except CentralRefused as exc:
                LOGGER.warning("central event %d not acted on: %s", seq, bounded(str(exc)))
                outcomes = []
            except RetryableError as exc:
                LOGGER.warning("central event %d left for a retry: %s", seq, bounded(str(exc)))
                break
            self._position = seq
            taken += 1
            for outcome in outcomes:
                self._on_outcome(outcome)
        self.sweep_when_due()
        return taken

    def sweep_when_due(self) -> None:
        now = self._clock()
        if self._swept_at is not None and now - self._swept_at < self._sweep_every:
            return
        self._swept_at = now
        for outcome in sweep_silent(self._deps, now):
            self._on_outcome(outcome)

    def _read(self, limit: int) -> list[tuple[int, Any]]:
        try:
            answer = self._session.get(self._url, params={"after": self._position, "limit": limit}, timeout=10)
            answer.raise_for_status()
            entries = answer.json()["events"]
        except (requests.RequestException, ValueError, KeyError) as exc:
            LOGGER.warning("the central feed at %s cannot be read now: %s", self._url, bounded(str(exc)))
            return []
        return [(int(entry["seq"]), entry["event"]) for entry in entries]

    def close(self) -> None:
        self._session.close()
