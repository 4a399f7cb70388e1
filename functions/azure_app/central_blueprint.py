"""The control plane's path on Azure Functions (docs/architecture.md#two-paths): the Scheduled Events
that the Event Grid system topic of `Microsoft.ResourceNotifications.MaintenanceResources` delivers
into a Service Bus queue (`MBRIDGE_CENTRAL_QUEUE`), the reconciliation with Resource Graph's
`maintenanceresources` table every five minutes (`MBRIDGE_CENTRAL_RECONCILE`), and the sweep for
silent agents once a minute.

function_app.py registers these functions (`blueprints`) only when the queue is set or the
reconciliation is on, each path's function for its own setting and the sweep for either: a
deployment with neither runs the events topic's function alone.

A delivered event that is not this deployment's (another subscription or resource group: the system
topic reports the whole subscription) or cannot be read is logged and acknowledged: it can never be
acted on, and dead-lettering every other group's maintenance would bury what matters.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from datetime import datetime, timezone
from typing import Any

import azure.functions as func

from functions.azure_app import logs, settings
from functions.azure_app.blueprint import DEPS
from functions.azure_app.redelivery import backing_off
from functions.azure_app.resource_graph import resource_graph_rows
from functions.central.event_grid import AzureScope, event_grid_report
from functions.central.resource_graph import ResourceGraphRows, reconcile
from functions.core.central import NOTICE_REFUSED, CentralRefused, process_central, sweep_silent
from functions.core.invocation import reporting
from functions.core.ports import Result
from functions.core.process import Deps, Outcome
from functions.core.telemetry import CENTRAL
from wire.bounds import bounded

LOGGER = logging.getLogger("mbridge.functions.azure.central")

CENTRAL_FUNCTION, SWEEP_FUNCTION, RECONCILE_FUNCTION = "maintenance_central", "silent_agents", "maintenance_reconcile"
SWEEP_SCHEDULE = "0 * * * * *"  # at second 0 of every minute (NCRONTAB, with seconds)
# At second 30 of every fifth minute. Event Grid is the fast path; this pass only catches what it
# missed, so it need not be faster than Azure's shortest notice allows: a Scheduled Freeze or Reboot
# comes 15 minutes ahead (Redeploy 10), and a pass every 5 minutes still finds a lost one with most
# of its notice left, and a lost Completed within 5 minutes. Each pass costs one Resource Graph query
# per 1,000 rows (15 queries in 5 seconds is the documented quota) and a store read per VM part.
RECONCILE_SCHEDULE = "30 */5 * * * *"

# The library leaves Blueprint's constructor unannotated.
central_bp = func.Blueprint()  # type: ignore[no-untyped-call]  # the Event Grid events' queue
sweep_bp = func.Blueprint()  # type: ignore[no-untyped-call]  # the silent agents' sweep
reconcile_bp = func.Blueprint()  # type: ignore[no-untyped-call]  # Resource Graph's rows


def blueprints(queue: bool, reconcile: bool) -> list[func.Blueprint]:
    """The control plane's functions to register: each path's for its setting (`central_functions`),
    and the sweep, which watches what either path reported, with either."""
    chosen = [central_bp] if queue else []
    chosen += [reconcile_bp] if reconcile else []
    return [*chosen, sweep_bp] if chosen else []


@functools.cache
def _scope() -> AzureScope:
    return settings.Settings.from_env(os.environ).central_scope


@functools.cache
def _rows() -> ResourceGraphRows:
    from azure.identity import DefaultAzureCredential

    return resource_graph_rows(DefaultAzureCredential())


@central_bp.function_name(CENTRAL_FUNCTION)
@central_bp.service_bus_queue_trigger(
    arg_name="msg", connection=settings.SERVICEBUS_CONNECTION, queue_name=f"%{settings.CENTRAL_QUEUE}%"
)
def maintenance_central(msg: func.ServiceBusMessage) -> None:
    logs.configure()
    backing_off(
        lambda: handle_central(msg.get_body(), DEPS.get(), _scope(), datetime.now(timezone.utc)),
        getattr(msg, "delivery_count", None),
    )


@sweep_bp.function_name(SWEEP_FUNCTION)
@sweep_bp.timer_trigger(arg_name="timer", schedule=SWEEP_SCHEDULE, run_on_startup=False)
def silent_agents(timer: func.TimerRequest) -> None:
    logs.configure()
    found = sweep_silent(DEPS.get(), datetime.now(timezone.utc))
    if found:
        LOGGER.info("silent-agent sweep: %d part(s) found silent", len(found))


@reconcile_bp.function_name(RECONCILE_FUNCTION)
@reconcile_bp.timer_trigger(arg_name="timer", schedule=RECONCILE_SCHEDULE, run_on_startup=False)
def maintenance_reconcile(timer: func.TimerRequest) -> None:
    logs.configure()
    reconcile(_rows(), DEPS.get(), _scope(), datetime.now(timezone.utc))


def handle_central(body: bytes, deps: Deps, scope: AzureScope, now: datetime) -> list[Outcome]:
    """Act on one delivered message: an Event Grid event, or a JSON array of them (one invocation
    of operation `central` to telemetry).

    Raises:
        RetryableError: a transient failure; the platform redelivers the message.
    """
    outcomes: list[Outcome] = []
    with reporting(deps, now, CENTRAL) as told:
        try:
            document: Any = json.loads(body)
        except ValueError as exc:
            LOGGER.error("a message on the central queue is not JSON, acknowledged unread: %s", bounded(str(exc)))
            told.refuse(Result.MALFORMED.value)
            return []
        for event in document if isinstance(document, list) else [document]:
            if not isinstance(event, dict):
                LOGGER.error("a message on the central queue holds %s, not an Event Grid event", type(event).__name__)
                told.refuse(Result.MALFORMED.value)
                continue
            try:
                report = event_grid_report(event, scope)
            except CentralRefused as exc:
                LOGGER.info("central event %s not acted on: %s", str(event.get("id", ""))[:64], bounded(str(exc)))
                told.refuse(NOTICE_REFUSED)
                continue
            outcomes += process_central(report, deps, now, told=told)
    return outcomes
