"""The control plane's path on Cloud Functions (docs/architecture.md#two-paths): two entry points.

- `on_central_log_entry`: the Compute Engine system-event audit log entries a log sink routes to
  the `maintenance-central` topic (infra/terraform/gcp), each one a LogEntry in JSON as the
  message's data, read into a report (functions/central/gce_system_event.py) and acted on.
- `on_central_tick`: a Cloud Scheduler message on the tick topic once a minute; each tick reads the
  instances' `upcomingMaintenance` from the Compute API (upcoming.py: what the log's sink did not
  deliver, or gave before this deployment started) and then sweeps for silent agents
  (`sweep_silent`). A tick that cannot list the instances still sweeps, and is not redelivered:
  the next one comes in a minute.

An entry that is not this deployment's (another project's instance: a sink on a folder or an
organisation sees them all) or that cannot be read is logged and acknowledged: it can never be
acted on, and a retry or the dead-letter topic would bury what matters. A transient failure raises
(HTTP 500) and Pub/Sub redelivers, as for the events topic (entry.py).

Only Google writes system-event entries; who can publish to the topic the sink writes to is the
trust of this path (docs/security.md, "Reports from the control plane").
"""

from __future__ import annotations

import functools
import json
import logging
from datetime import datetime, timezone
from typing import Any

import functions_framework
import google.auth.exceptions
from cloudevents.http import CloudEvent
from google.cloud import compute_v1

from functions.central.gce_system_event import system_event_report
from functions.central.gce_upcoming import GceScope, upcoming_report
from functions.central.polling import poll_pass
from functions.core.central import GCE_UPCOMING, NOTICE_REFUSED, CentralRefused, process_central, sweep_silent
from functions.core.invocation import reporting
from functions.core.notify import NotifyingAuditLog
from functions.core.ports import Result
from functions.core.process import Deps, Outcome
from functions.core.telemetry import CENTRAL
from functions.gcp_app import wiring
from functions.gcp_app.entry import NOTICE_SETTLE_SECONDS, UndecodableEventError, log_outcome, message_body
from functions.gcp_app.settings import Settings
from functions.gcp_app.upcoming import ComputeUpcoming, UpcomingInstances
from wire.bounds import bounded
from wire.errors import BridgeError

LOG = logging.getLogger("mbridge.gcp.central")


@functools.cache
def _scope() -> GceScope:
    settings = Settings.from_env()
    return GceScope(projects=settings.trusted_projects, zones=settings.trust_zones)


def handle_log_entry(body: bytes, deps: Deps, scope: GceScope, now: datetime) -> list[Outcome]:
    """Act on one message of the sink's topic: a LogEntry in JSON (one invocation of operation
    `central` to telemetry).

    Raises:
        RetryableError: a transient failure; Pub/Sub redelivers the message.
    """
    with reporting(deps, now, CENTRAL) as told:
        try:
            entry: Any = json.loads(body)
        except ValueError as exc:
            LOG.error("a message on the central topic is not JSON, acknowledged unread: %s", bounded(str(exc)))
            told.refuse(Result.MALFORMED.value)
            return []
        if not isinstance(entry, dict):
            LOG.error("a message on the central topic holds %s, not a LogEntry", type(entry).__name__)
            told.refuse(Result.MALFORMED.value)
            return []
        try:
            report = system_event_report(entry, scope)
        except CentralRefused as exc:
            LOG.warning(
                "system-event entry %s not acted on: %s",
                bounded(str(entry.get("insertId")), 64),
                bounded(str(exc)),
                extra={"labels": {"result": "refused"}},
            )
            told.refuse(NOTICE_REFUSED)
            return []
        if report is None:
            return []
        outcomes = process_central(report, deps, now, told=told)
        _logged(outcomes, deps, {"source": report.source, "notice_id": report.notice_id[:64]})
    return outcomes


def handle_tick(
    deps: Deps, now: datetime, upcoming: UpcomingInstances | None = None, scope: GceScope | None = None
) -> list[Outcome]:
    """One tick of the scheduler: the instances' upcoming maintenance when `upcoming` is given, then
    the sweep for silent agents."""
    if upcoming is not None and scope is not None:
        try:
            entries = upcoming.instances(scope)
            outcomes = poll_pass(entries, lambda instance: upcoming_report(instance, scope), deps, now, "upcoming")
        except BridgeError as exc:
            LOG.error(
                "upcoming maintenance not read on this tick: %s",
                bounded(str(exc)),
                extra={"labels": {"alert": "upcoming-unread"}},
            )
        else:
            _logged([o for o in outcomes if o.result is not Result.DUPLICATE], deps, {"source": GCE_UPCOMING})
    found = sweep_silent(deps, now)
    if found:
        LOG.info("silent-agent sweep: %d part(s) found silent", len(found))
    _logged(found, deps, {"source": "sweep"})
    return found


def _logged(outcomes: list[Outcome], deps: Deps, labels: dict[str, str]) -> None:
    for outcome in outcomes:
        log_outcome(outcome, labels)
    if outcomes and isinstance(deps.audit, NotifyingAuditLog):
        deps.audit.settle(NOTICE_SETTLE_SECONDS)  # as entry.handle_message: notices go out before the answer


@functions_framework.cloud_event
def on_central_log_entry(cloud_event: CloudEvent) -> None:
    """Deploy target: the push subscription of the log sink's topic."""
    deps = wiring.deps()  # first: it also configures structured logging on a fresh instance
    try:
        body = message_body(cloud_event)
    except UndecodableEventError as exc:
        LOG.error("acknowledged without processing: %s (CloudEvent id %s)", bounded(str(exc)), cloud_event["id"])
        return
    handle_log_entry(body, deps, _scope(), datetime.now(timezone.utc))


@functions_framework.cloud_event
def on_central_tick(cloud_event: CloudEvent) -> None:
    """Deploy target: the push subscription of the scheduler's tick topic (the message is not read)."""
    deps = wiring.deps()
    handle_tick(deps, datetime.now(timezone.utc), _upcoming(), _scope())


@functools.cache
def _upcoming() -> UpcomingInstances | None:
    """The Compute API's reader, or None when MBRIDGE_CENTRAL_UPCOMING is false or no client can be
    made (said in the log: the tick then only sweeps)."""
    settings = Settings.from_env()
    if not settings.central_upcoming:
        return None
    try:
        return ComputeUpcoming(compute_v1.InstancesClient(), settings.compute_timeout)
    except google.auth.exceptions.GoogleAuthError as exc:
        LOG.error(
            "no Compute client (%s): the tick reads no upcoming maintenance", bounded(str(exc)),
            extra={"labels": {"alert": "upcoming-unread"}},
        )  # fmt: skip
        return None
