"""The Service Bus topic trigger of the Azure app: one message in, `process` on it, nothing else.

The host settles the message from the outcome of the invocation (autoCompleteMessages in
host.json): returning completes it; raising abandons it, so Service Bus redelivers it and
dead-letters it after the subscription's max delivery count. Hence:

- a duplicate and a malformed envelope return (process audits them): completed, never retried;
- a RetryableError (throttling, a busy claim, an unreachable service) raises: redelivered;
- a PermanentError from an adapter (a missing role or resource) raises too: the message is
  kept, in the dead-letter queue at worst, to be resubmitted once the deployment is fixed.

Either waits first, longer each delivery (redelivery.py): Service Bus alone redelivers at once.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timezone

import azure.functions as func

from functions.azure_app import logs, settings
from functions.azure_app.redelivery import backing_off
from functions.azure_app.wiring import DepsProvider, from_environment
from functions.core.log_fields import event_fields, fields
from functions.core.process import Deps, Outcome, process
from wire.bounds import bounded
from wire.errors import PermanentError, RetryableError

LOGGER = logging.getLogger("mbridge.functions.azure")

FUNCTION_NAME = "maintenance_events"

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # the library leaves its constructor unannotated

# Built on the first message, shared by the invocations of this worker.
DEPS = DepsProvider(from_environment(os.environ))


@bp.function_name(FUNCTION_NAME)
@bp.service_bus_topic_trigger(
    arg_name="msg",
    connection=settings.SERVICEBUS_CONNECTION,
    topic_name=f"%{settings.EVENTS_TOPIC}%",
    subscription_name=f"%{settings.EVENTS_SUBSCRIPTION}%",
    cardinality="one",
)
def maintenance_events(msg: func.ServiceBusMessage) -> None:
    logs.configure()  # structured messages for Azure Monitor (functions.azure_app.logs)
    now = datetime.now(timezone.utc)
    # A failure waits before the message goes back: Service Bus alone would redeliver at once.
    backing_off(
        lambda: handle_message(msg.get_body(), DEPS.get(), now, enqueued_at(msg, now)),
        getattr(msg, "delivery_count", None),
    )


def enqueued_at(msg: func.ServiceBusMessage, now: datetime) -> datetime:
    """When Service Bus took the message (its enqueued time, UTC), or `now` when the host gave none.

    A sender's proof is checked as of then: one that was valid when the message was sent stays
    valid through a backlog or a redelivery.
    """
    enqueued = getattr(msg, "enqueued_time_utc", None)
    if not isinstance(enqueued, datetime):
        return now
    if enqueued.tzinfo is None:  # the library leaves a time without an offset naive; it is UTC
        return enqueued.replace(tzinfo=timezone.utc)
    return enqueued.astimezone(timezone.utc)


def handle_message(body: bytes, deps: Deps, now: datetime, accepted_at: datetime | None = None) -> Outcome:
    """Process one message body; raise to have the message redelivered. `accepted_at` is when
    the bus took the message (default: `now`).

    Raises:
        RetryableError: a transient failure; the platform redelivers the message.
        PermanentError: an adapter cannot work as deployed; the message dead-letters after the
            max delivery count, to be resubmitted once the deployment is fixed.
    """
    try:
        outcome = process(body, deps, now, accepted_at)
    except RetryableError as exc:
        LOGGER.warning("transient failure, the message will be redelivered: %s", bounded(str(exc)))
        raise
    except PermanentError as exc:
        LOGGER.error(
            "cannot act on the message until the deployment is fixed (it will dead-letter): %s", bounded(str(exc))
        )
        raise
    actions = ", ".join(f"{taken.action} {taken.vm}" for taken in outcome.actions) or "no action"
    # The event as its first action names it (an outcome without actions names none).
    about = event_fields(outcome.actions[0].event) if outcome.actions else {}
    LOGGER.info(
        "envelope %s: %s; %s",
        outcome.envelope_id[:16],
        outcome.result,
        bounded(actions),
        extra={
            **about,
            **fields(envelope_id=outcome.envelope_id, result=outcome.result.value, trace_id=outcome.trace_id),
        },
    )
    return outcome
