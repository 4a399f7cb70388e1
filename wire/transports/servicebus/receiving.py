"""The agent's command receivers: this VM's session of the commands queue, or (the isolated mode)
this VM's own subscription of the commands topic.

Both keep one receiver open, settle each command through the receiver that delivered it, and keep
the locks (the session's or each message's) that the coming wait and the settlement need.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Callable

from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus import exceptions as sb_errors

from wire.transports.base import CommandReceiver, InboundCommand, TransportConfigError, TransportUnavailableError
from wire.transports.servicebus.client import ReceiverLike, ServiceBusClientLike
from wire.transports.servicebus.errors import RECEIVER_ROLE, Entity, map_error
from wire.transports.servicebus.handlers import Reusable
from wire.transports.servicebus.messages import attributes_of, body_bytes
from wire.transports.servicebus.settings import ServiceBusSettings

LOG = logging.getLogger("mbridge.transport.servicebus")

MAX_COMMANDS_PER_RECEIVE = 10
# The longest one receive waits, whatever the agent asks: the SDK cannot cut a wait short, so this
# bounds how long a stopping agent's command thread may linger, and a session lock (renewed before
# each receive for the wait ahead) never has to outlast more than this.
MAX_RECEIVE_WAIT_SECONDS = 20.0
# Renew the session lock when less than this (plus the coming wait) is left. Messages of a session
# are locked by the session lock, so it must outlive the wait and the agent's handling of a command.
SESSION_RENEW_MARGIN = timedelta(seconds=15)
# Outside sessions each message has its own lock: renewed before completing when less than this is left.
MESSAGE_RENEW_MARGIN = SESSION_RENEW_MARGIN


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class _Settle:
    """`InboundCommand.settle` of one received message: completes it once, through the receiver
    that received it (Service Bus only accepts settlement on the link that holds the lock)."""

    def __init__(self, owner: CommandReceiving, receiver: ReceiverLike, message: ServiceBusReceivedMessage):
        self._owner = owner
        self._receiver = receiver
        self._message = message
        self._done = False

    def __call__(self) -> None:
        if self._done:
            return
        self._owner._complete(self._receiver, self._message)
        self._done = True


class CommandReceiving(CommandReceiver):
    """What both command receivers share: one receiver kept open and replaced after an error,
    commands settled through the receiver that delivered them, SDK errors mapped (map_error).
    Subclasses say which entity they read and how its locks are kept."""

    _open_action = "open the command receiver"

    def __init__(
        self,
        entity: Entity,
        create: Callable[[], ReceiverLike],
        settings: ServiceBusSettings,
        now: Callable[[], datetime],
    ) -> None:
        self._settings = settings
        self._now = now
        self._entity = entity
        self._receiver: Reusable[ReceiverLike] = Reusable(create)
        self._lock = threading.Lock()

    # The hooks: keep the locks that the coming wait and the settlement need.

    def _before_receive(self, receiver: ReceiverLike, max_wait: float) -> None:
        pass

    def _before_complete(self, receiver: ReceiverLike, message: ServiceBusReceivedMessage) -> None:
        pass

    def receive_commands(self, max_wait: float) -> Sequence[InboundCommand]:
        max_wait = min(max_wait, MAX_RECEIVE_WAIT_SECONDS)
        with self._lock:
            receiver = self._receiver.get()
            try:
                self._before_receive(receiver, max_wait)
                messages = receiver.receive_messages(max_message_count=MAX_COMMANDS_PER_RECEIVE, max_wait_time=max_wait)
            except Exception as error:
                mapped = self._failed(error, receiver, "receive commands")
                if mapped is None:
                    raise
                raise mapped from error
        return [self._command(receiver, message) for message in messages]

    def interrupt(self) -> None:
        """Nothing to do: the SDK's wait cannot be cut short; it ends within MAX_RECEIVE_WAIT_SECONDS."""

    def open(self) -> None:
        """Attach the receiver: performs the Listen authorisation (and, on a session, takes this
        VM's session lock) without requesting any message (no link credit until a receive)."""
        with self._lock:
            receiver = self._receiver.get()
            try:
                receiver.__enter__()
            except Exception as error:
                mapped = self._failed(error, receiver, self._open_action)
                if mapped is None:
                    raise
                raise mapped from error

    def close(self) -> None:
        with self._lock:
            self._receiver.discard()

    def _command(self, receiver: ReceiverLike, message: ServiceBusReceivedMessage) -> InboundCommand:
        return InboundCommand(
            body=body_bytes(message.body),
            attributes=attributes_of(message),
            settle=_Settle(self, receiver, message),
            delivery_count=message.delivery_count,
        )

    def _complete(self, receiver: ReceiverLike, message: ServiceBusReceivedMessage) -> None:
        with self._lock:
            if not self._receiver.is_current(receiver):
                raise TransportUnavailableError(
                    f"the receiver that delivered command message {message.message_id!r} was closed after an error; "
                    "Service Bus redelivers the command once its lock expires"
                )
            try:
                self._before_complete(receiver, message)
                receiver.complete_message(message)
            except sb_errors.MessageAlreadySettled:
                LOG.debug("command message %s was already settled", message.message_id)
            except Exception as error:
                mapped = self._failed(error, receiver, "complete a command")
                if mapped is None:
                    raise
                raise mapped from error

    def _failed(self, error: Exception, receiver: ReceiverLike, action: str) -> Exception | None:
        """Our error for `error` (None: not a bus failure, let it propagate); drops the broken receiver."""
        mapped = map_error(error, self._entity, action)
        if mapped is None:
            if isinstance(error, ValueError):
                # The SDK raises ValueError for a handler that was shut down under us.
                mapped = TransportUnavailableError(f"the command receiver on {self._entity} was closed: {error}")
            else:
                return None
        if self._receiver.is_current(receiver):
            self._receiver.discard()
        return mapped


class ServiceBusCommandReceiver(CommandReceiving):
    """Receives this VM's commands: a receiver on the commands queue bound to session = VM name."""

    _open_action = "open the command session"

    def __init__(
        self,
        client: ServiceBusClientLike,
        settings: ServiceBusSettings,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        super().__init__(
            Entity("queue", settings.commands_queue, "--servicebus-commands-queue", RECEIVER_ROLE, settings.endpoint),
            lambda: client.get_queue_receiver(settings.commands_queue, session_id=settings.vm_name),
            settings,
            now,
        )

    def _before_receive(self, receiver: ReceiverLike, max_wait: float) -> None:
        self._renew_if_needed(receiver, max_wait)

    def _before_complete(self, receiver: ReceiverLike, message: ServiceBusReceivedMessage) -> None:
        self._renew_if_needed(receiver, 0.0)

    def _renew_if_needed(self, receiver: ReceiverLike, horizon_seconds: float) -> None:
        locked_until = receiver.session.locked_until_utc
        horizon = self._now() + timedelta(seconds=horizon_seconds) + SESSION_RENEW_MARGIN
        if locked_until is None or locked_until <= horizon:
            receiver.session.renew_lock(timeout=self._settings.operation_timeout)


class ServiceBusSubscriptionCommandReceiver(CommandReceiving):
    """Receives this VM's commands in the isolated mode: a plain (sessionless) receiver on this
    VM's own subscription of the commands topic. The subscription's filter passes only this VM's
    commands and only this VM's identity may read it (infra/). Each message has its own lock, renewed
    before completing when it is about to run out; settling is otherwise the session receiver's."""

    _open_action = "open the command subscription"

    def __init__(
        self,
        client: ServiceBusClientLike,
        settings: ServiceBusSettings,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        topic, subscription = settings.commands_topic, settings.commands_subscription
        if not topic or not subscription:
            raise TransportConfigError(
                "the isolated commands mode needs the commands topic and this VM's subscription "
                "(--servicebus-commands-topic, --servicebus-commands-subscription)"
            )
        super().__init__(
            Entity(
                "subscription",
                f"{topic}/subscriptions/{subscription}",
                "--servicebus-commands-subscription",
                RECEIVER_ROLE,
                settings.endpoint,
            ),
            lambda: client.get_subscription_receiver(topic, subscription),
            settings,
            now,
        )

    def _before_complete(self, receiver: ReceiverLike, message: ServiceBusReceivedMessage) -> None:
        locked_until = message.locked_until_utc
        if locked_until is not None and locked_until <= self._now() + MESSAGE_RENEW_MARGIN:
            receiver.renew_message_lock(message, timeout=self._settings.operation_timeout)
