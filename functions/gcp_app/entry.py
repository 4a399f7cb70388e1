"""The Cloud Functions (gen2) entry point: Pub/Sub `messagePublished` CloudEvents.

They come from a push subscription: Eventarc's, or the Terraform's own one with a dead-letter
policy, whose raw push body (`{"message": ..., "subscription": ...}`) the functions framework
turns into the same CloudEvent.

    on_maintenance_event(cloud_event) → message_body → handle_message(body, deps, now) → process

The message's `publishTime` (when Pub/Sub took it) goes to `process` as `accepted_at`: a sender's
proof is checked as of then, so a backlog or a redelivery does not expire a genuine one.

- Returning normally acknowledges the message (HTTP 2xx to the push subscription).
- Raising fails the invocation (HTTP 500) and Pub/Sub redelivers with backoff until the
  subscription's dead-letter policy moves the message aside. Every error of `process` and of the
  adapters propagates: RetryableError because a retry can succeed, PermanentError from an adapter
  (missing role, missing instance group) because the event has not been acted on and must stay
  in the dead-letter topic for a replay once the configuration is fixed.
- Malformed envelopes are audited and acknowledged by `process` itself (retrying cannot help).
- A messagePublished event whose Pub/Sub message cannot be decoded at all (no message, data
  that is not base64) holds nothing to audit under an envelope id: it is logged and acknowledged.

The decorated function stays a thin shell: tests call `handle_message` and `message_body`
directly, and `on_maintenance_event` with a hand-built CloudEvent or over HTTP.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import functions_framework
from cloudevents.http import CloudEvent

from functions.core.notify import NotifyingAuditLog
from functions.core.process import Deps, Outcome, process
from functions.gcp_app import wiring
from wire.bounds import bounded
from wire.errors import PermanentError, RetryableError
from wire.timefmt import format_rfc3339, parse_rfc3339

LOG = logging.getLogger("mbridge.gcp.entry")

MESSAGE_PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"
# The actions of an outcome listed in its log line's payload; the others are counted.
LOGGED_ACTIONS = 20
# How long a request waits, after its action, for its webhook notices to go out (a notice gives up
# within 8 s; a request makes at most a few): past this the rest wait for the next request.
NOTICE_SETTLE_SECONDS = 10.0


class UndecodableEventError(Exception):
    """The CloudEvent holds no Pub/Sub message whose data could be read."""


def message_body(cloud_event: CloudEvent) -> bytes:
    """The Pub/Sub message data of a messagePublished CloudEvent, decoded from base64.

    A message without data yields b"" (process audits it as malformed).

    Raises:
        UndecodableEventError: not a messagePublished event, or no message, or data not base64.
    """
    if cloud_event["type"] != MESSAGE_PUBLISHED:
        raise UndecodableEventError(
            f"event type {cloud_event['type']!r} is not {MESSAGE_PUBLISHED}: the trigger must be the Pub/Sub "
            "events topic"
        )
    data = cloud_event.get_data()
    message = data.get("message") if isinstance(data, Mapping) else None
    if not isinstance(message, Mapping):
        raise UndecodableEventError("the event data holds no Pub/Sub message object")
    encoded = message.get("data", "")
    if not isinstance(encoded, str):
        raise UndecodableEventError(f"message.data is a {type(encoded).__name__}, not base64 text")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UndecodableEventError(f"message.data is not base64: {exc}") from exc


def _message_id(cloud_event: CloudEvent) -> str:
    """Pub/Sub's id of the message, for the log lines of this invocation ("" when absent)."""
    data = cloud_event.get_data()
    message = data.get("message") if isinstance(data, Mapping) else None
    return str(message.get("messageId", "")) if isinstance(message, Mapping) else ""


def publish_time(cloud_event: CloudEvent) -> datetime | None:
    """When Pub/Sub took the message (`publishTime`, RFC 3339), or None when absent or unreadable."""
    data = cloud_event.get_data()
    message = data.get("message") if isinstance(data, Mapping) else None
    if not isinstance(message, Mapping):
        return None
    text = message.get("publishTime") or message.get("publish_time")
    if not isinstance(text, str):
        return None
    try:
        return parse_rfc3339(text)
    except ValueError:
        LOG.warning("publishTime %r is not RFC 3339; the proof is checked as of now", bounded(text, 100))
        return None


def handle_message(
    body: bytes,
    deps: Deps,
    now: datetime,
    *,
    labels: Mapping[str, str] | None = None,
    accepted_at: datetime | None = None,
) -> Outcome:
    """Process one events-topic message body and log what was done. `accepted_at` is when the bus
    took the message (default: `now`).

    Raises:
        RetryableError: transient; the platform must redeliver.
        PermanentError: an adapter refused for a configuration reason; the message goes on to
            the dead-letter topic for a replay after the fix.
    """
    context = dict(labels or {})
    try:
        outcome = process(body, deps, now, accepted_at)
    except RetryableError as exc:
        LOG.warning("will be redelivered: %s", bounded(str(exc)), extra={"labels": context})
        raise
    except PermanentError as exc:
        LOG.error(
            "cannot act on this message until the configuration is fixed (it goes to the dead-letter topic "
            "after the subscription's delivery attempts; replay it from there): %s",
            bounded(str(exc)),
            extra={"labels": context},
        )
        raise
    log_outcome(outcome, context)
    if isinstance(deps.audit, NotifyingAuditLog):
        # Cloud Functions gives an instance CPU only while it serves a request: notices still queued
        # when this one returns would wait for the next. The action is done; only the answer waits,
        # and no longer than the webhook's own bound.
        deps.audit.settle(NOTICE_SETTLE_SECONDS)
    return outcome


def log_outcome(outcome: Outcome, context: dict[str, str]) -> None:
    labels = {**context, "envelope_id": outcome.envelope_id, "result": outcome.result}
    if outcome.actions:
        event = outcome.actions[0].event
        labels.update({"event_id": event.event_id, "vm": event.reporter, "status": event.status.value})
    if outcome.trace_id:
        labels["trace_id"] = outcome.trace_id
    # The first actions only (an event of 1,000 VMs takes 1,000 drains): a line stays a few KiB.
    actions: list[dict[str, Any]] = [
        {
            "action": taken.action,
            "vm": taken.vm,
            "at": format_rfc3339(taken.at) if taken.at else None,
            "reason": taken.reason,
        }
        for taken in outcome.actions[:LOGGED_ACTIONS]
    ]
    payload: dict[str, Any] = {"actions": actions, "rule": outcome.decision.rule if outcome.decision else ""}
    if len(outcome.actions) > LOGGED_ACTIONS:
        payload["actions_not_listed"] = len(outcome.actions) - LOGGED_ACTIONS
    summary = ", ".join(f"{taken.action} {taken.vm}" for taken in outcome.actions) or "no action"
    LOG.info(
        "%s %s: %s",
        outcome.result,
        outcome.envelope_id[:16],
        bounded(summary),
        extra={"labels": labels, "payload": payload},
    )


@functions_framework.cloud_event
def on_maintenance_event(cloud_event: CloudEvent) -> None:
    """Deploy target: triggered by `google.cloud.pubsub.topic.v1.messagePublished` on the events topic."""
    deps = wiring.deps()  # first: it also configures structured logging on a fresh instance
    labels = {"message_id": _message_id(cloud_event)}
    try:
        body = message_body(cloud_event)
    except UndecodableEventError as exc:
        LOG.error(
            "acknowledged without processing: %s (CloudEvent id %s, source %s)",
            bounded(str(exc)),
            cloud_event["id"],
            cloud_event["source"],
            extra={"labels": labels},
        )
        return
    now = datetime.now(timezone.utc)
    handle_message(body, deps, now, labels=labels, accepted_at=publish_time(cloud_event) or now)
