"""Azure Service Bus transport, on the official `azure-servicebus` SDK.

Contracts: docs/contracts.md#on-the-bus, #routing and #transport-options.

- Events go to a topic (`maintenance-events`), one message per envelope, `MessageId` = SHA-256 of the
  body as sent (command results: their envelope id), so the topic's duplicate detection drops an
  identical resend but never one VM's report in favour of another's.
- Commands come from a session-enabled queue (`maintenance-commands`); the agent binds its receiver
  to the session named after its VM, so it only ever sees its own commands, in order.
- Or, in the isolated mode (`--servicebus-commands-subscription`), from this VM's own subscription
  of a commands topic (also `maintenance-commands`), whose filter passes only the messages whose
  application property `target` is this VM and on which only this VM's identity holds the Data
  Receiver role. No sessions there: a VM cannot be given a role on one session of a queue, but it
  can on one subscription of a topic.
- `mbridge approve` (and the functions) send into that queue with `SessionId` = target VM, or into
  the topic with the application property `target`, and read the command results from the events
  topic through a subscription (`operator-results`).

Handlers (senders, receivers) are opened once and reused; after any error the handler is closed and a
new one is created on next use, because the SDK does not recover a handler whose link has failed (a
session receiver in particular refuses every call after a connection error).

The SDK is imported here only: the agent imports this module when this transport is chosen.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Callable, Generic, Protocol, TypeVar

from azure.core.exceptions import AzureError, ClientAuthenticationError
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus import exceptions as sb_errors

from wire.transports.base import (
    AgentTransport,
    CommandReceiver,
    CommandSender,
    InboundCommand,
    OutboundMessage,
    ResultReader,
    TransportConfigError,
    TransportUnavailableError,
)

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

LOG = logging.getLogger("mbridge.transport.servicebus")

EVENT_CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
COMMAND_CONTENT_TYPE = "application/json; charset=utf-8"
MAX_COMMANDS_PER_RECEIVE = 10
MAX_RESULTS_PER_READ = 50
# Renew the session lock when less than this (plus the coming wait) is left. Messages of a session
# are locked by the session lock, so it must outlive the wait and the agent's handling of a command.
SESSION_RENEW_MARGIN = timedelta(seconds=15)
# Outside sessions each message has its own lock: renewed before completing when less than this is left.
MESSAGE_RENEW_MARGIN = SESSION_RENEW_MARGIN

SENDER_ROLE = "Azure Service Bus Data Sender"
RECEIVER_ROLE = "Azure Service Bus Data Receiver"


# ---------------------------------------------------------------- settings


@dataclass(frozen=True)
class ServiceBusSettings:
    """Options of the Service Bus transport (docs/contracts.md#transport-options). Exactly one of `namespace` (managed
    identity) and `connection_string` (SAS) is set; `vm_name` is needed by the agent only.

    `commands_topic` set: commands travel through that topic instead of the session queue (the
    isolated mode); the agent then receives from its own subscription `commands_subscription`.
    """

    namespace: str | None = None
    # repr=False: a connection string carries the shared access key.
    connection_string: str | None = field(default=None, repr=False)
    topic: str = "maintenance-events"
    commands_queue: str = "maintenance-commands"
    results_subscription: str = "operator-results"
    vm_name: str = ""
    operation_timeout: float = 30.0
    commands_topic: str | None = None
    commands_subscription: str | None = None

    def validate(self) -> None:
        """Raise TransportConfigError naming the flag to set when the options cannot work."""
        if self.namespace and self.connection_string:
            raise TransportConfigError(
                "set either --servicebus-namespace FQDN (managed identity) or --servicebus-connection-string, not both"
            )
        if not self.namespace and not self.connection_string:
            raise TransportConfigError(
                "the servicebus transport needs --servicebus-namespace FQDN (managed identity, e.g. "
                "mybus.servicebus.windows.net) or --servicebus-connection-string"
            )
        if self.namespace is not None:
            _validate_namespace(self.namespace)
        names = [
            ("--servicebus-topic", self.topic),
            ("--servicebus-commands-queue", self.commands_queue),
            ("the results subscription name", self.results_subscription),
        ]
        if self.commands_topic is not None:
            names.append(("--servicebus-commands-topic", self.commands_topic))
        if self.commands_subscription is not None:
            names.append(("--servicebus-commands-subscription", self.commands_subscription))
        for flag, value in names:
            if not value.strip():
                raise TransportConfigError(f"{flag} is empty: give the name of the Service Bus entity")
        if self.commands_subscription is not None and self.commands_topic is None:
            raise TransportConfigError(
                "--servicebus-commands-subscription names a subscription of the commands topic: "
                "give the topic too (--servicebus-commands-topic, default maintenance-commands)"
            )
        if self.operation_timeout <= 0:
            raise TransportConfigError(
                f"the Service Bus operation timeout must be positive, not {self.operation_timeout}"
            )

    @property
    def endpoint(self) -> str:
        """The namespace, for messages; never the connection string (it holds a key)."""
        if self.namespace:
            return self.namespace
        return _namespace_of(self.connection_string or "") or "the namespace of the connection string"


def _validate_namespace(namespace: str) -> None:
    if namespace.lower().startswith("endpoint="):
        raise TransportConfigError(
            "--servicebus-namespace got a connection string: pass it with --servicebus-connection-string instead"
        )
    if "." not in namespace or any(character.isspace() for character in namespace):
        raise TransportConfigError(
            f"--servicebus-namespace takes the fully qualified namespace, e.g. mybus.servicebus.windows.net, "
            f"not {namespace!r}"
        )


def _namespace_of(connection_string: str) -> str | None:
    for part in connection_string.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "endpoint":
            return value.strip().removeprefix("sb://").rstrip("/")
    return None


# ---------------------------------------------------------------- the SDK surface used here
# Protocols of the few SDK calls this module makes, so that tests can hand in small fakes of the
# network edge while still building and reading the SDK's real message types.


class SessionLike(Protocol):
    @property
    def locked_until_utc(self) -> datetime | None: ...

    def renew_lock(self, *, timeout: float | None = ...) -> datetime: ...


class SenderLike(Protocol):
    def send_messages(self, message: ServiceBusMessage, *, timeout: float | None = ...) -> None: ...

    def create_message_batch(self) -> object: ...

    def close(self) -> None: ...


class ReceiverLike(Protocol):
    @property
    def session(self) -> SessionLike: ...

    def __enter__(self) -> object: ...

    def receive_messages(
        self, max_message_count: int | None = ..., max_wait_time: float | None = ...
    ) -> list[ServiceBusReceivedMessage]: ...

    def complete_message(self, message: ServiceBusReceivedMessage) -> None: ...

    def renew_message_lock(self, message: ServiceBusReceivedMessage, *, timeout: float | None = ...) -> datetime: ...

    def close(self) -> None: ...


class ServiceBusClientLike(Protocol):
    def get_topic_sender(self, topic_name: str) -> SenderLike: ...

    def get_queue_sender(self, queue_name: str) -> SenderLike: ...

    def get_queue_receiver(self, queue_name: str, *, session_id: str | None = ...) -> ReceiverLike: ...

    def get_subscription_receiver(self, topic_name: str, subscription_name: str) -> ReceiverLike: ...

    def close(self) -> None: ...


ClientFactory = Callable[[ServiceBusSettings], ServiceBusClientLike]


def connect(settings: ServiceBusSettings, credential: TokenCredential | None = None) -> ServiceBusClientLike:
    """The real SDK client: SAS from the connection string, or the namespace with `credential`
    (default: DefaultAzureCredential, which uses the VM's managed identity; AZURE_CLIENT_ID selects
    a user-assigned one). Nothing touches the network until a handler opens."""
    settings.validate()
    if settings.connection_string:
        try:
            client: ServiceBusClientLike = ServiceBusClient.from_connection_string(settings.connection_string)
        except ValueError:
            # `from None`: the SDK's error could quote the string, and with it the key.
            raise TransportConfigError(
                "--servicebus-connection-string is malformed: copy it from the namespace's or entity's "
                "shared access policy (Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...)"
            ) from None
        return client
    if credential is None:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    return ServiceBusClient(settings.namespace or "", credential)


def _default_factory(credential: TokenCredential | None) -> ClientFactory:
    def factory(settings: ServiceBusSettings) -> ServiceBusClientLike:
        return connect(settings, credential)

    return factory


# ---------------------------------------------------------------- error mapping


@dataclass(frozen=True)
class _Entity:
    """What an operation addresses, to say in errors which entity and which role is concerned."""

    kind: str  # "topic" | "queue" | "subscription"
    name: str
    flag: str
    role: str
    namespace: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name!r} in {self.namespace}"


def map_error(error: BaseException, entity: _Entity, action: str) -> Exception | None:
    """Our error for an SDK (or network) error, or None when `error` is not a bus failure."""
    if isinstance(error, sb_errors.SessionCannotBeLockedError):
        return TransportUnavailableError(
            f"cannot lock the session of this VM on {entity}: another agent with the same VM name may be running "
            f"(or a previous connection's lock has not expired yet); will retry: {error}"
        )
    if isinstance(error, sb_errors.SessionLockLostError):
        return TransportUnavailableError(
            f"lost the session lock of this VM on {entity} (connection dropped, lock expired, or another agent with "
            f"the same VM name may be running); the session is reopened on next use: {error}"
        )
    if isinstance(error, (sb_errors.ServiceBusAuthenticationError, ClientAuthenticationError)):
        return TransportConfigError(
            f"authentication failed while trying to {action} on {entity}: with --servicebus-namespace the "
            f"VM needs a managed identity (AZURE_CLIENT_ID selects a user-assigned one); with "
            f"--servicebus-connection-string check the key: {error}"
        )
    if isinstance(error, sb_errors.ServiceBusAuthorizationError):
        return TransportConfigError(
            f"not authorised to {action} on {entity}: grant the identity the role {entity.role!r} on the "
            f"{entity.kind} (or use a SAS policy with the {'Send' if 'Sender' in entity.role else 'Listen'} claim): "
            f"{error}"
        )
    if isinstance(error, sb_errors.MessagingEntityNotFoundError):
        return TransportConfigError(
            f"{entity} does not exist: deploy it (infra/) or set {entity.flag} to the right name: {error}"
        )
    if isinstance(error, sb_errors.MessagingEntityDisabledError):
        return TransportConfigError(f"{entity} is disabled: enable it in the namespace: {error}")
    if isinstance(error, sb_errors.MessageSizeExceededError):
        return TransportConfigError(f"the message is larger than {entity} accepts: {error}")
    if isinstance(error, sb_errors.ServiceBusQuotaExceededError):
        return TransportUnavailableError(f"{entity} is full (its consumers are behind); will retry: {error}")
    if isinstance(error, (AzureError, OSError)):
        # Connection, communication, timeout and server-busy errors, and sockets failing under the SDK.
        return TransportUnavailableError(f"cannot {action} on {entity} now; will retry: {error}")
    return None


# ---------------------------------------------------------------- handler lifetime

Handler = TypeVar("Handler", SenderLike, ReceiverLike)


class _Reusable(Generic[Handler]):
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


class _Sending:
    """A sender to one entity, reused, serialised (the SDK's handlers are not thread-safe)."""

    def __init__(self, create: Callable[[], SenderLike], entity: _Entity, timeout: float) -> None:
        self._sender: _Reusable[SenderLike] = _Reusable(create)
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


# ---------------------------------------------------------------- receiving


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _text(value: object) -> str:
    # Application properties arrive as bytes (the SDK's AMQP decoder keeps strings as bytes).
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _attributes(message: ServiceBusReceivedMessage) -> dict[str, str]:
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


class _Settle:
    """`InboundCommand.settle` of one received message: completes it once, through the receiver
    that received it (Service Bus only accepts settlement on the link that holds the lock)."""

    def __init__(self, owner: _CommandReceiving, receiver: ReceiverLike, message: ServiceBusReceivedMessage):
        self._owner = owner
        self._receiver = receiver
        self._message = message
        self._done = False

    def __call__(self) -> None:
        if self._done:
            return
        self._owner._complete(self._receiver, self._message)
        self._done = True


class _CommandReceiving(CommandReceiver):
    """What both command receivers share: one receiver kept open and replaced after an error,
    commands settled through the receiver that delivered them, SDK errors mapped (map_error).
    Subclasses say which entity they read and how its locks are kept."""

    _open_action = "open the command receiver"

    def __init__(
        self,
        entity: _Entity,
        create: Callable[[], ReceiverLike],
        settings: ServiceBusSettings,
        now: Callable[[], datetime],
    ) -> None:
        self._settings = settings
        self._now = now
        self._entity = entity
        self._receiver: _Reusable[ReceiverLike] = _Reusable(create)
        self._lock = threading.Lock()

    # The hooks: keep the locks that the coming wait and the settlement need.

    def _before_receive(self, receiver: ReceiverLike, max_wait: float) -> None:
        pass

    def _before_complete(self, receiver: ReceiverLike, message: ServiceBusReceivedMessage) -> None:
        pass

    def receive_commands(self, max_wait: float) -> Sequence[InboundCommand]:
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
            attributes=_attributes(message),
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


class ServiceBusCommandReceiver(_CommandReceiving):
    """Receives this VM's commands: a receiver on the commands queue bound to session = VM name."""

    _open_action = "open the command session"

    def __init__(
        self,
        client: ServiceBusClientLike,
        settings: ServiceBusSettings,
        now: Callable[[], datetime] = _utc_now,
    ) -> None:
        super().__init__(
            _Entity("queue", settings.commands_queue, "--servicebus-commands-queue", RECEIVER_ROLE, settings.endpoint),
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


class ServiceBusSubscriptionCommandReceiver(_CommandReceiving):
    """Receives this VM's commands in the isolated mode: a plain (sessionless) receiver on this
    VM's own subscription of the commands topic. The subscription's filter passes only this VM's
    commands and only this VM's identity may read it (infra/). Each message has its own lock, renewed
    before completing when it is about to run out; settling is otherwise the session receiver's."""

    _open_action = "open the command subscription"

    def __init__(
        self,
        client: ServiceBusClientLike,
        settings: ServiceBusSettings,
        now: Callable[[], datetime] = _utc_now,
    ) -> None:
        topic, subscription = settings.commands_topic, settings.commands_subscription
        if not topic or not subscription:
            raise TransportConfigError(
                "the isolated commands mode needs the commands topic and this VM's subscription "
                "(--servicebus-commands-topic, --servicebus-commands-subscription)"
            )
        super().__init__(
            _Entity(
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


# ---------------------------------------------------------------- the agent's transport


def _outbound(
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


class ServiceBusTransport(AgentTransport):
    """The agent's transport: publishes envelopes to the topic, receives this VM's commands."""

    name = "servicebus"

    def __init__(
        self,
        settings: ServiceBusSettings,
        *,
        client_factory: ClientFactory | None = None,
        credential: TokenCredential | None = None,
        now: Callable[[], datetime] = _utc_now,
    ) -> None:
        settings.validate()
        if settings.commands_topic is not None and settings.commands_subscription is None:
            raise TransportConfigError(
                "commands through a topic (--servicebus-commands-topic) are received from this VM's own "
                "subscription of it: set --servicebus-commands-subscription too"
            )
        isolated = settings.commands_subscription is not None
        if not isolated and not settings.vm_name.strip():
            raise TransportConfigError(
                "the servicebus transport needs this VM's name: it is the session the agent receives commands from"
            )
        self._settings = settings
        self._client = (client_factory or _default_factory(credential))(settings)
        self._entity = _Entity("topic", settings.topic, "--servicebus-topic", SENDER_ROLE, settings.endpoint)
        self._events = _Sending(
            lambda: self._client.get_topic_sender(settings.topic), self._entity, settings.operation_timeout
        )
        self._commands: _CommandReceiving
        if isolated:
            self._commands = ServiceBusSubscriptionCommandReceiver(self._client, settings, now)
        else:
            self._commands = ServiceBusCommandReceiver(self._client, settings, now)

    def publish(self, message: OutboundMessage) -> None:
        self._events.send(_outbound(message, EVENT_CONTENT_TYPE))

    @property
    def commands(self) -> CommandReceiver | None:
        return self._commands

    def check(self) -> str:
        self._events.open()
        self._commands.open()
        settings = self._settings
        if settings.commands_subscription is not None:
            source = f"subscription {settings.commands_subscription!r} of topic {settings.commands_topic!r}"
        else:
            source = f"session {settings.vm_name!r} of queue {settings.commands_queue!r}"
        return (
            f"servicebus: authorised to send to topic {settings.topic!r} and to receive {source} in {settings.endpoint}"
        )

    def close(self) -> None:
        self._events.close()
        self._commands.close()
        self._client.close()


# ---------------------------------------------------------------- the operator's side


class ServiceBusOperator(CommandSender, ResultReader):
    """What `mbridge approve` (and the functions) use: sends a command into the target VM's session
    of the commands queue, or with `commands_topic` onto that topic with the application property
    `target` that the VMs' subscription filters match; reads command results from the events topic
    through the results subscription (completing what it reads)."""

    def __init__(
        self,
        settings: ServiceBusSettings,
        *,
        client_factory: ClientFactory | None = None,
        credential: TokenCredential | None = None,
    ) -> None:
        settings.validate()
        self._settings = settings
        self._client = (client_factory or _default_factory(credential))(settings)
        self._results_entity = _Entity(
            "subscription",
            f"{settings.topic}/subscriptions/{settings.results_subscription}",
            "--servicebus-topic",
            RECEIVER_ROLE,
            settings.endpoint,
        )
        topic, queue = settings.commands_topic, settings.commands_queue
        if topic is not None:
            entity = _Entity("topic", topic, "--servicebus-commands-topic", SENDER_ROLE, settings.endpoint)
            self._commands = _Sending(lambda: self._client.get_topic_sender(topic), entity, settings.operation_timeout)
        else:
            entity = _Entity("queue", queue, "--servicebus-commands-queue", SENDER_ROLE, settings.endpoint)
            self._commands = _Sending(lambda: self._client.get_queue_sender(queue), entity, settings.operation_timeout)
        self._results: _Reusable[ReceiverLike] = _Reusable(
            lambda: self._client.get_subscription_receiver(settings.topic, settings.results_subscription)
        )
        self._lock = threading.Lock()

    def send_command(self, message: OutboundMessage) -> None:
        if not message.key:
            raise TransportConfigError(
                "a command needs a target VM (the message key): it is the queue session, or the property the "
                "subscriptions of the commands topic filter on"
            )
        in_session = self._settings.commands_topic is None
        self._commands.send(_outbound(message, COMMAND_CONTENT_TYPE, target=message.key, in_session=in_session))

    def read_results(self, max_wait: float) -> Sequence[bytes]:
        with self._lock:
            receiver = self._results.get()
            try:
                messages = receiver.receive_messages(max_message_count=MAX_RESULTS_PER_READ, max_wait_time=max_wait)
            except Exception as error:
                mapped = self._results_failed(error, "read command results")
                if mapped is None:
                    raise
                raise mapped from error
            self._complete_all(receiver, messages)
        return [body_bytes(message.body) for message in messages]

    def _complete_all(self, receiver: ReceiverLike, messages: Sequence[ServiceBusReceivedMessage]) -> None:
        # What was received is returned even when completing fails: the uncompleted results come
        # again later, and reading a result twice is harmless to a caller looking for its command.
        for message in messages:
            try:
                receiver.complete_message(message)
            except Exception as error:
                LOG.warning("could not complete command results; they will be read again: %s", error)
                if map_error(error, self._results_entity, "complete command results") is None:
                    raise
                self._results.discard()
                return

    def _results_failed(self, error: Exception, action: str) -> Exception | None:
        mapped = map_error(error, self._results_entity, action)
        if mapped is not None:
            self._results.discard()
        return mapped

    def check(self) -> str:
        """Open the command sender and the results receiver: both authorise without moving a message."""
        self._commands.open()
        with self._lock:
            receiver = self._results.get()
            try:
                receiver.__enter__()
            except Exception as error:
                mapped = self._results_failed(error, "open the results subscription")
                if mapped is None:
                    raise
                raise mapped from error
        commands = self._settings.commands_topic
        destination = f"topic {commands!r}" if commands is not None else f"queue {self._settings.commands_queue!r}"
        return f"servicebus: authorised to send to {destination} and to read {self._results_entity}"

    def close(self) -> None:
        self._commands.close()
        with self._lock:
            self._results.discard()
        self._client.close()


# ---------------------------------------------------------------- construction


def build_agent_transport(
    settings: ServiceBusSettings, *, credential: TokenCredential | None = None
) -> ServiceBusTransport:
    """The agent's Service Bus transport on the real SDK (validates the settings)."""
    return ServiceBusTransport(settings, credential=credential)


def build_operator(settings: ServiceBusSettings, *, credential: TokenCredential | None = None) -> ServiceBusOperator:
    """The `mbridge approve` side on the real SDK (validates the settings)."""
    return ServiceBusOperator(settings, credential=credential)


__all__ = [
    "COMMAND_CONTENT_TYPE",
    "EVENT_CONTENT_TYPE",
    "ClientFactory",
    "ReceiverLike",
    "SenderLike",
    "ServiceBusClientLike",
    "ServiceBusCommandReceiver",
    "ServiceBusOperator",
    "ServiceBusSettings",
    "ServiceBusSubscriptionCommandReceiver",
    "ServiceBusTransport",
    "SessionLike",
    "body_bytes",
    "build_agent_transport",
    "build_operator",
    "connect",
    "map_error",
]
