"""The control plane's path on Azure Functions (docs/architecture.md#two-paths): the Scheduled Events
that the Event Grid system topic of `Microsoft.ResourceNotifications.MaintenanceResources` delivers
into a Service Bus queue (`MBRIDGE_CENTRAL_QUEUE`), and the sweep for silent agents once a minute.

function_app.py registers these functions only when `MBRIDGE_CENTRAL_QUEUE` is set: a deployment
without the queue runs the events topic's function alone.

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
from functions.central.event_grid import AzureScope, event_grid_report
from functions.core.central import CentralRefused, process_central, sweep_silent
from functions.core.process import Deps, Outcome
from wire.bounds import bounded

LOGGER = logging.getLogger("mbridge.functions.azure.central")

CENTRAL_FUNCTION, SWEEP_FUNCTION = "maintenance_central", "silent_agents"
SWEEP_SCHEDULE = "0 * * * * *"  # at second 0 of every minute (NCRONTAB, with seconds)

central_bp = func.Blueprint()  # type: ignore[no-untyped-call]  # the library leaves its constructor unannotated


@functools.cache
def _scope() -> AzureScope:
    return settings.Settings.from_env(os.environ).central_scope


@central_bp.function_name(CENTRAL_FUNCTION)
@central_bp.service_bus_queue_trigger(
    arg_name="msg", connection=settings.SERVICEBUS_CONNECTION, queue_name=f"%{settings.CENTRAL_QUEUE}%"
)
def maintenance_central(msg: func.ServiceBusMessage) -> None:
    logs.configure()
    handle_central(msg.get_body(), DEPS.get(), _scope(), datetime.now(timezone.utc))


@central_bp.function_name(SWEEP_FUNCTION)
@central_bp.timer_trigger(arg_name="timer", schedule=SWEEP_SCHEDULE, run_on_startup=False)
def silent_agents(timer: func.TimerRequest) -> None:
    logs.configure()
    found = sweep_silent(DEPS.get(), datetime.now(timezone.utc))
    if found:
        LOGGER.info("silent-agent sweep: %d part(s) found silent", len(found))


def handle_central(body: bytes, deps: Deps, scope: AzureScope, now: datetime) -> list[Outcome]:
    """Act on one delivered message: an Event Grid event, or a JSON array of them.

    Raises:
        RetryableError: a transient failure; the platform redelivers the message.
    """
    try:
        document: Any = json.loads(body)
    except ValueError as exc:
        LOGGER.error("a message on the central queue is not JSON, acknowledged unread: %s", bounded(str(exc)))
        return []
    outcomes: list[Outcome] = []
    for event in document if isinstance(document, list) else [document]:
        if not isinstance(event, dict):
            LOGGER.error("a message on the central queue holds %s, not an Event Grid event", type(event).__name__)
            continue
        try:
            report = event_grid_report(event, scope)
        except CentralRefused as exc:
            LOGGER.info("central event %s not acted on: %s", str(event.get("id", ""))[:64], bounded(str(exc)))
            continue
        outcomes += process_central(report, deps, now)
    return outcomes
