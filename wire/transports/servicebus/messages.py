"""Between our messages and the SDK's: the outgoing message (MessageId, properties, session) and the
payload and properties of a received one.

What the agent, the operator and the functions read off a message must be what the others put on
it, so both directions live together.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage

from wire.transports.base import OutboundMessage

EVENT_CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
COMMAND_CONTENT_TYPE = "application/json; charset=utf-8"


def _text(value: object) -> str:
    # Application properties arrive as bytes (the SDK's AMQP decoder keeps strings as bytes).
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def attributes_of(message: ServiceBusReceivedMessage) -> dict[str, str]:
    properties = message.application_properties or {}
    return {_text(key): _text(value) for key, value in properties.items()}


def body_bytes(body: object) -> bytes:
    """The payload of a message: DATA bodies arrive as bytes or as an iterable of byte sections."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, Iterable):
        try:
            return b"".join(bytes(section) for section in body)
        except TypeError:
            pass
    # A value/sequence body that some other tool sent: hand it on as text, so the agent's command
    # validation rejects it (and settles it) instead of it blocking the session.
    return b"" if body is None else str(body).encode("utf-8")


def outbound(
    message: OutboundMessage, content_type: str, *, target: str | None = None, in_session: bool = False
) -> ServiceBusMessage:
    """A message for `message`; with `target`, a command for that VM: the application property
    `target` (what the per-VM subscription filters match) and, `in_session`, SessionId = target."""
    # The SDK's own value type (PrimitiveTypes); string keys and values are all this module sends.
    properties: dict[str | bytes, int | float | bytes | bool | str | uuid.UUID] = {}
    for key, value in message.attributes.items():
        properties[key] = value
    properties["envelope_id"] = message.envelope_id
    if target is not None:
        properties["target"] = target
    session_id = target if in_session else None
    return ServiceBusMessage(
        message.body,
        message_id=message.bus_id,
        session_id=session_id,
        application_properties=properties,
        content_type=content_type,
        subject=message.attributes.get("type"),
    )
