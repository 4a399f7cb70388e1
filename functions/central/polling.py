"""One pass over a polled feed of the control plane (Azure Resource Graph's rows, the Compute API's
instances): every entry read into a report and acted on, repeats of steps already taken from that
feed quietly (`process_central(quiet_repeats=True)`): a feed read again every pass reports every
step again, and the audit log would otherwise grow by the whole fleet's notices each pass. A pass is
one invocation of operation `central` to telemetry (functions/core/telemetry.py), whatever it read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Optional

from functions.core.central import NOTICE_REFUSED, CentralRefused, CentralReport, process_central
from functions.core.invocation import reporting
from functions.core.ports import Result
from functions.core.process import Deps, Outcome
from functions.core.telemetry import CENTRAL
from wire.bounds import bounded

LOGGER = logging.getLogger("mbridge.functions.central.polling")

# What an entry reports: None for one with no maintenance to report.
ReportOf = Callable[[Mapping[str, Any]], Optional[CentralReport]]


def poll_pass(
    entries: Iterable[Mapping[str, Any]], report_of: ReportOf, deps: Deps, now: datetime, feed: str
) -> list[Outcome]:
    """Act on every entry; one that is not ours, or cannot be read, is logged and passed (the next
    pass reads it again, and it cannot become ours).

    Raises:
        RetryableError: a transient failure reading the feed or acting on an entry: the pass stops,
            and the next one reads the feed again.
    """
    outcomes: list[Outcome] = []
    refused = 0
    with reporting(deps, now, CENTRAL) as told:
        for entry in entries:
            try:
                report = report_of(entry)
            except CentralRefused as exc:
                refused += 1
                told.refuse(NOTICE_REFUSED)
                name = entry.get("id") or entry.get("name") or ""
                LOGGER.info("%s: %s not acted on: %s", feed, str(name)[:200], bounded(str(exc)))
                continue
            if report is not None:
                outcomes += process_central(report, deps, now, quiet_repeats=True, told=told)
    acted = [outcome for outcome in outcomes if outcome.result is not Result.DUPLICATE]
    LOGGER.info(
        "%s: %d VM part(s) acted on, %d already seen, %d entry(ies) not ours or unreadable",
        feed,
        len(acted),
        len(outcomes) - len(acted),
        refused,
    )
    return outcomes
