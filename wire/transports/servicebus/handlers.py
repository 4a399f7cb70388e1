"""The lifetime of Service Bus handlers: opened once, reused, and replaced after an error.

The SDK does not recover a handler whose link has failed (a session receiver in particular refuses
every call after a connection error), so after any error the handler is closed and a new one is
created on next use.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Generic, TypeVar

from azure.servicebus import ServiceBusMessage

from wire.transports.servicebus.client import ReceiverLike, SenderLike
from wire.transports.servicebus.errors import Entity, map_error

LOG = logging.getLogger("mbridge.transport.servicebus")

Handler = TypeVar("Handler", SenderLike, ReceiverLike)


class Reusable(Generic[Handler]):
    """One handler, created on first use, kept open, and discarded after an error."""

    def __init__(self, create: Callable[[], Handler]) -> None:
        self._create: Callable[[], Handler] = create
        self._handler: Handler | None = None

    def get(self) -> Handler:
        if self._handler is None:
            self._handler = self._create()
        return self._handler

    def is_current(self, handler: Handler) -> bool:
        return self._handler is handler

    def discard(self) -> None:
        handler, self._handler = self._handler, None
        if handler is None:
            return
        try:
            handler.close()
        except Exception:  # a broken link may fail to close; it is dropped either way
            LOG.debug("closing a failed Service Bus handler raised", exc_info=True)


class Sending:
    """A sender to one entity, reused, serialised (the SDK's handlers are not thread-safe)."""

    def __init__(self, create: Callable[[], SenderLike], entity: Entity, timeout: float) -> None:
        self._sender: Reusable[SenderLike] = Reusable(create)
        self._entity = entity
        self._timeout = timeout
        self._lock = threading.Lock()

    def send(self, message: ServiceBusMessage) -> None:
        with self._lock:
            self._guarded(lambda sender: sender.send_messages(message, timeout=self._timeout), "send")

    def open(self) -> None:
        """Open the link without sending: attaching a sender performs the claims-based
        authorisation (Send) and fails for a missing entity. The batch is thrown away."""
        with self._lock:
            self._guarded(lambda sender: sender.create_message_batch(), "open a sender")

    def close(self) -> None:
        with self._lock:
            self._sender.discard()

    def _guarded(self, operation: Callable[[SenderLike], object], action: str) -> None:
        try:
            operation(self._sender.get())
        except Exception as error:
            mapped = map_error(error, self._entity, action)
            if mapped is None:
                raise
            self._sender.discard()
            raise mapped from error
