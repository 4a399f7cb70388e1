"""The control plane's path for the local function host: a simulator's central feed, read as the
cloud would deliver it, and the sweep for silent agents on a timer (docs/architecture.md#two-paths).

The feed is `GET /_sim/central/events?after=N` of a simulator (docs/simulator.md), in delivery
order, duplicates included: an Azure simulator's Event Grid `ScheduledEventEmitted` events (as an
Event Grid subscription delivers them), a GCE simulator's system-event log entries (as a log sink
delivers them to Pub/Sub). `azure_reports` and `gce_reports` make each into a `CentralReport` of
the VMs in the deployment's scope, acted on by the core; one that is not ours, or cannot be read,
is logged and passed (a cloud queue would dead-letter it: it can never be acted on). A transient
failure leaves the read position where it is, like a platform retry.

With a `Recorder`, each report acted on and each sweep is written down with its time, before it is
done (`functions.local_app.recording`), beside the bus's messages the local host records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Optional

import requests

from functions.central.event_grid import AzureScope, event_grid_report
from functions.central.gce_system_event import system_event_report
from functions.central.gce_upcoming import GceScope
from functions.core.central import CentralRefused, CentralReport, process_central, sweep_silent
from functions.core.process import Deps, Outcome
from functions.local_app.recording import Recorder
from wire.bounds import bounded
from wire.errors import RetryableError

LOGGER = logging.getLogger("mbridge.functions.local.central")

SWEEP_EVERY = timedelta(seconds=60)  # as the cloud apps' timer: once a minute
# What a feed's entry reports: None for an entry that is no maintenance notice.
ReportOf = Callable[[Any], Optional[CentralReport]]


def azure_reports(scope: AzureScope) -> ReportOf:
    return lambda event: event_grid_report(event, scope)


def gce_reports(scope: GceScope) -> ReportOf:
    return lambda entry: system_event_report(entry, scope)


class CentralFeedReader:
    """Reads a simulator's central feed into the core, and sweeps for silent agents (unless
    `sweep_every` is None: another reader of the same functions sweeps)."""

    def __init__(
        self,
        feed_url: str,
        deps: Deps,
        report_of: ReportOf,
        clock: Callable[[], datetime],
        *,
        sweep_every: timedelta | None = SWEEP_EVERY,
        on_outcome: Callable[[Outcome], None] = lambda outcome: None,
        session: requests.Session | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self._url = feed_url.rstrip("/") + "/_sim/central/events"
        self._deps = deps
        self._report_of = report_of
        self._clock = clock
        self._sweep_every = sweep_every
        self._on_outcome = on_outcome
        self._session = session or requests.Session()
        self._recorder = recorder
        self._position = 0
        self._swept_at: datetime | None = None

    def step(self, limit: int = 100) -> int:
        """Act on what the feed has since the last step, then sweep when it is time; how many events
        were taken."""
        taken = 0
        for seq, event in self._read(limit):
            try:
                report = self._report_of(event)
                outcomes = [] if report is None else self._process(report)
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
        if self._sweep_every is None or (self._swept_at is not None and now - self._swept_at < self._sweep_every):
            return
        self._swept_at = now
        if self._recorder is not None:
            self._recorder.sweep(now)
        for outcome in sweep_silent(self._deps, now):
            self._on_outcome(outcome)

    def _process(self, report: CentralReport) -> list[Outcome]:
        now = self._clock()
        if self._recorder is not None:
            self._recorder.central(report, now)
        return process_central(report, self._deps, now)

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
