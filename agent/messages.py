"""The messages the agent publishes: a maintenance event or a command result as a bus message,
cut to fit what a bus carries, and which events are this VM's to forward.

Kept apart from the threads that move them (agent.loop): this is what goes on the wire, that is
when and in which order.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from datetime import datetime

from agent.logs import event_fields
from wire.bounds import MAX_ENVELOPE_BYTES, PROOF_ROOM_BYTES, bounded
from wire.envelope import encode, envelope_for_command_result, envelope_for_event
from wire.model import Cloud, CommandResult, MaintenanceEvent
from wire.tracecontext import TraceContext, new_trace, received
from wire.transports.base import OutboundMessage

LOGGER = logging.getLogger("mbridge.agent")
# How each cloud names the field that becomes `description` (named in `unreadable` when it is cut).
DESCRIPTION_FIELD = {Cloud.AZURE: "Description", Cloud.GCE: "description"}
RESOURCES_FIELD = {Cloud.AZURE: "Resources", Cloud.GCE: "resources"}
# The most an envelope may weigh before its proof is added.
MAX_UNPROVEN_BYTES = MAX_ENVELOPE_BYTES - PROOF_ROOM_BYTES


def event_message(event: MaintenanceEvent, observed_at: datetime, trace: TraceContext | None = None) -> OutboundMessage:
    """The bus message of an event, carrying `trace` (its maintenance's trace, this publish's span)."""
    extensions = trace.attributes() if trace is not None else None
    envelope = envelope_for_event(event, observed_at, extensions)
    body = encode(envelope)
    if len(body) > MAX_UNPROVEN_BYTES:
        # A bus refuses a message this large, and the outbox never skips a row: one huge entry would
        # hold up every envelope after it. What the functions act on stays; the rest is cut.
        event = cut_to_fit(event, len(body))
        envelope = envelope_for_event(event, observed_at, extensions)
        body = encode(envelope)
    if len(body) > MAX_UNPROVEN_BYTES:
        # Only Resources can still be this large (thousands of names, more than any set holds):
        # keep whether this VM is affected, which is what its own maintenance needs.
        mine = tuple(vm for vm in event.resources if vm == event.reporter)
        named = tuple(dict.fromkeys((*event.unreadable, RESOURCES_FIELD[event.cloud])))
        envelope = envelope_for_event(replace(event, resources=mine, unreadable=named), observed_at, extensions)
        body = encode(envelope)
    return OutboundMessage(
        envelope_id=envelope.id,
        body=body,
        key=event.reporter,
        attributes={
            "type": envelope.type,
            "vm": event.reporter,
            "cloud": event.cloud.value,
            "event_id": event.event_id,
        },
    )


def with_message_id(message: OutboundMessage) -> OutboundMessage:
    """The message with its bus id: the digest of the body as it goes out (see OutboundMessage)."""
    return replace(message, message_id=hashlib.sha256(message.body).hexdigest())


def names_this_vm(event: MaintenanceEvent) -> bool:
    """Whether an event is this VM's to report (`--forward own`): its Resources name this VM, or
    they could not be read (forwarded rather than dropped: it may be this VM's)."""
    return event.concerns_reporter or RESOURCES_FIELD[event.cloud] in event.unreadable or not event.resources


def cut_to_fit(event: MaintenanceEvent, size: int) -> MaintenanceEvent:
    """The event without its raw entry (a digest and its size instead) and with its description
    bounded, both named in `unreadable`. The envelope id does not depend on them: every report of
    the event keeps the same id."""
    raw = json.dumps(event.raw, ensure_ascii=False, sort_keys=True).encode("utf-8")
    cut = {"cut_bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    LOGGER.warning(
        "event %s makes an envelope of %d bytes, over the %d a bus message holds with a proof: its raw entry and "
        "description are cut",
        event.event_id[:80],
        size,
        MAX_UNPROVEN_BYTES,
        extra=event_fields(event),
    )
    named = tuple(dict.fromkeys((*event.unreadable, "raw", DESCRIPTION_FIELD[event.cloud])))
    return replace(event, raw=cut, description=bounded(event.description), unreadable=named)


def result_message(result: CommandResult, cloud: Cloud, vm_name: str, at: datetime) -> OutboundMessage:
    """The bus message of a command's result; a span of the command's trace when it carried one."""
    trace = new_trace(result.trace_id).attributes() if result.trace_id else None
    envelope = envelope_for_command_result(result, cloud, at, trace)
    return OutboundMessage(
        envelope_id=envelope.id,
        body=encode(envelope),
        key=vm_name,
        attributes={"type": envelope.type, "vm": vm_name, "cloud": cloud.value, "event_id": result.event_id},
    )


def trace_id_of(message: OutboundMessage) -> str | None:
    """The trace id a message's envelope carries, for the log lines about it (None: none, or a row
    an earlier version recorded)."""
    carried = trace_of(message)
    return carried.trace_id if carried is not None else None


def trace_of(message: OutboundMessage) -> TraceContext | None:
    """The trace context a message's envelope carries: its trace, and the span of its publish."""
    try:
        document = json.loads(message.body)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    carried, _ = received(document)
    return carried
