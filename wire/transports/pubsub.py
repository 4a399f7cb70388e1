"""Google Cloud Pub/Sub transport, on the official `google-cloud-pubsub` library.

Contracts: docs/contracts.md#on-the-bus, #routing and #transport-options.

- Events go to a topic (`maintenance-events`) with ordering key = VM name and attributes repeating
  `type`, `vm`, `cloud`, `event_id` (plus `envelope_id`, since Pub/Sub assigns its own message ids).
- Commands are published to `maintenance-commands` with attribute `target` = VM; each VM pulls from
  its own subscription (`maintenance-commands-<vm>`, filtered on `target` in the cloud). Emulators
  ignore filters, so the agent also drops (and acknowledges) commands addressed to other VMs.
- `mbridge approve` publishes a command and reads results from the events topic through a
  subscription (`operator-results`).

Every call is a single attempt bounded by a timeout (`retry=None`): the agent's loop retries with
backoff, and with ordering enabled the library would otherwise retry a publish forever.

PUBSUB_EMULATOR_HOST is honoured by the library itself (plain-text channel, no credentials).
The library is imported here only: the agent imports this module when this transport is chosen.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Protocol

import google.cloud.pubsub_v1 as pubsub_v1  # type: ignore[import-untyped]  # the library ships no py.typed
from google.api_core import exceptions as api_errors
from google.auth import exceptions as auth_errors
from google.cloud.pubsub_v1.publisher import exceptions as publisher_errors  # type: ignore[import-untyped]

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

LOG = logging.getLogger("mbridge.transport.pubsub")

EMULATOR_VARIABLE = "PUBSUB_EMULATOR_HOST"
MAX_COMMANDS_PER_PULL = 10
# A pull may come back empty at once (the emulator always does; the service may) instead of waiting
# for its deadline. The next one goes out no sooner than this after the last began: at most five
# pulls a second when idle, at most this much added to a command's way.
MIN_EMPTY_PULL_SECONDS = 0.2
MAX_RESULTS_PER_PULL = 50
# How much longer than the RPC timeout to wait for a publish future (batching adds a few ms).
FUTURE_GRACE_SECONDS = 5.0

PUBLISH_PERMISSION = "pubsub.topics.publish"
CONSUME_PERMISSION = "pubsub.subscriptions.consume"
PUBLISHER_ROLE = "roles/pubsub.publisher"
SUBSCRIBER_ROLE = "roles/pubsub.subscriber"


# ---------------------------------------------------------------- settings


@dataclass(frozen=True)
class PubSubSettings:
    """Options of the Pub/Sub transport (docs/contracts.md#transport-options). Names may also be full
    resource paths (`projects/P/topics/T`), e.g. for a topic in another project. `vm_name` is needed by the agent."""

    project: str
    topic: str = "maintenance-events"
    commands_topic: str = "maintenance-commands"
    commands_subscription: str | None = None
    results_subscription: str = "operator-results"
    vm_name: str = ""
    operation_timeout: float = 30.0

    def validate(self) -> None:
        """Raise TransportConfigError naming the flag to set when the options cannot work."""
        if not self.project.strip():
            raise TransportConfigError(
                "the pubsub transport needs --pubsub-project (the Google Cloud project id of the topics)"
            )
        for flag, value in (
            ("--pubsub-topic", self.topic),
            ("the commands topic name", self.commands_topic),
            ("the results subscription name", self.results_subscription),
        ):
            if not value.strip():
                raise TransportConfigError(f"{flag} is empty: give the name of the Pub/Sub resource")
        if self.commands_subscription is not None and not self.commands_subscription.strip():
            raise TransportConfigError("--pubsub-commands-subscription is empty: omit it to use the default")
        if self.operation_timeout <= 0:
            raise TransportConfigError(f"the Pub/Sub operation timeout must be positive, not {self.operation_timeout}")

    @property
    def commands_subscription_name(self) -> str:
        """The agent's command subscription: the configured one, or `maintenance-commands-<vm name>`."""
        return self.commands_subscription or f"maintenance-commands-{self.vm_name}"

    def topic_path(self, name: str) -> str:
        return name if name.startswith("projects/") else f"projects/{self.project}/topics/{name}"

    def subscription_path(self, name: str) -> str:
        return name if name.startswith("projects/") else f"projects/{self.project}/subscriptions/{name}"


# ---------------------------------------------------------------- the library surface used here
# The library ships no type information; these protocols name the calls this module makes, so
# that the code type-checks and a test can substitute the network edge.


class PublishFuture(Protocol):
    def result(self, timeout: float | None = ...) -> object: ...


class PublisherLike(Protocol):
    def publish(
        self, topic: str, data: bytes, ordering_key: str = ..., retry: Any = ..., timeout: Any = ..., **attrs: str
    ) -> PublishFuture: ...

    def resume_publish(self, topic: str, ordering_key: str) -> None: ...

    def get_topic(self, *, topic: str, retry: Any = ..., timeout: Any = ...) -> object: ...

    def test_iam_permissions(self, *, request: Mapping[str, Any], retry: Any = ..., timeout: Any = ...) -> Any: ...

    def stop(self) -> None: ...


class SubscriberLike(Protocol):
    def pull(
        self, *, subscription: str, max_messages: int, retry: Any = ..., timeout: Any = ...
    ) -> Any: ...  # PullResponse: .received_messages[i].ack_id / .message.data / .message.attributes

    def acknowledge(
        self, *, subscription: str, ack_ids: Sequence[str], retry: Any = ..., timeout: Any = ...
    ) -> None: ...

    def get_subscription(self, *, subscription: str, retry: Any = ..., timeout: Any = ...) -> object: ...

    def test_iam_permissions(self, *, request: Mapping[str, Any], retry: Any = ..., timeout: Any = ...) -> Any: ...

    def close(self) -> None: ...


PublisherFactory = Callable[[], PublisherLike]
SubscriberFactory = Callable[[], SubscriberLike]


def new_publisher() -> PublisherLike:
    """The real publisher, with message ordering (events of one VM stay in order)."""
    publisher: PublisherLike = pubsub_v1.PublisherClient(
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    return publisher


def new_subscriber() -> SubscriberLike:
    subscriber: SubscriberLike = pubsub_v1.SubscriberClient()
    return subscriber


def emulator_host() -> str | None:
    """The emulator the library talks to, if any (it reads the same variable)."""
    return os.environ.get(EMULATOR_VARIABLE) or None


# ---------------------------------------------------------------- error mapping


@dataclass(frozen=True)
class _Resource:
    """What an operation addresses, to say in errors which resource and which role is concerned."""

    kind: str  # "topic" | "subscription"
    path: str
    flag: str
    role: str

    def __str__(self) -> str:
        return f"{self.kind} {self.path}"


def map_error(error: BaseException, resource: _Resource, action: str) -> Exception | None:
    """Our error for a library (or network) error, or None when `error` is not a bus failure."""
    if isinstance(error, api_errors.NotFound):
        return TransportConfigError(f"{resource} does not exist: create it (infra/) or set {resource.flag}: {error}")
    if isinstance(error, api_errors.PermissionDenied):
        return TransportConfigError(
            f"not allowed to {action} on {resource}: grant {resource.role} on it to the VM's service account: {error}"
        )
    if isinstance(error, (api_errors.Unauthenticated, auth_errors.DefaultCredentialsError, auth_errors.RefreshError)):
        return TransportConfigError(
            f"Google credentials were missing or rejected while trying to {action} on {resource}: on GCE attach a "
            f"service account with the cloud-platform scope, elsewhere set GOOGLE_APPLICATION_CREDENTIALS, or set "
            f"{EMULATOR_VARIABLE} for the emulator: {error}"
        )
    if isinstance(error, (api_errors.InvalidArgument, api_errors.FailedPrecondition)):
        return TransportConfigError(f"Pub/Sub refused to {action} on {resource}: check {resource.flag}: {error}")
    if isinstance(error, publisher_errors.MessageTooLargeError):
        return TransportConfigError(f"the message is larger than Pub/Sub accepts ({action} on {resource}): {error}")
    if isinstance(error, (api_errors.DeadlineExceeded, concurrent.futures.TimeoutError)):
        return TransportUnavailableError(f"timed out trying to {action} on {resource}; will retry: {error!r}")
    if isinstance(
        error,
        (
            api_errors.GoogleAPIError,  # ServiceUnavailable and every other RPC failure
            publisher_errors.PublishToPausedOrderingKeyException,  # an earlier failure of this key
            publisher_errors.FlowControlLimitError,
            auth_errors.TransportError,  # the metadata server could not be reached for a token
            OSError,
        ),
    ):
        return TransportUnavailableError(f"cannot {action} on {resource} now; will retry: {error}")
    return None


def _raise_mapped(error: Exception, resource: _Resource, action: str) -> NoReturn:
    mapped = map_error(error, resource, action)
    if mapped is None:
        raise error
    raise mapped from error


# ---------------------------------------------------------------- shared pieces


class _Lazy:
    """The publisher and subscriber, created on first use (constructing one reads credentials)."""

    def __init__(self, publisher_factory: PublisherFactory, subscriber_factory: SubscriberFactory) -> None:
        self._publisher_factory = publisher_factory
        self._subscriber_factory = subscriber_factory
        self._publisher: PublisherLike | None = None
        self._subscriber: SubscriberLike | None = None
        self._lock = threading.Lock()

    def publisher(self, resource: _Resource) -> PublisherLike:
        with self._lock:
            if self._publisher is None:
                self._publisher = self._create(self._publisher_factory, resource)
            return self._publisher

    def subscriber(self, resource: _Resource) -> SubscriberLike:
        with self._lock:
            if self._subscriber is None:
                self._subscriber = self._create(self._subscriber_factory, resource)
            return self._subscriber

    @staticmethod
    def _create(factory: Callable[[], Any], resource: _Resource) -> Any:
        try:
            return factory()
        except auth_errors.GoogleAuthError as error:
            _raise_mapped(error, resource, "create a Pub/Sub client")

    def close(self) -> None:
        with self._lock:
            publisher, self._publisher = self._publisher, None
            subscriber, self._subscriber = self._subscriber, None
        if publisher is not None:
            try:
                publisher.stop()  # flushes what is batched; publish() already waited for everything it sent
            except RuntimeError:
                LOG.debug("the publisher was already stopped")
        if subscriber is not None:
            subscriber.close()


def _publish(
    publisher: PublisherLike,
    resource: _Resource,
    message: OutboundMessage,
    attributes: Mapping[str, str],
    timeout: float,
) -> None:
    """Publish one message and wait until Pub/Sub has stored it."""
    try:
        future = publisher.publish(
            resource.path, message.body, ordering_key=message.key, retry=None, timeout=timeout, **attributes
        )
        future.result(timeout=timeout + FUTURE_GRACE_SECONDS)
    except Exception as error:
        _resume(publisher, resource.path, message.key)
        _raise_mapped(error, resource, "publish")


def _resume(publisher: PublisherLike, topic: str, ordering_key: str) -> None:
    # After a failed publish the library pauses the ordering key and fails every later message
    # with that key until resumed; the caller's retry republishes the same message, so order holds.
    if not ordering_key:
        return
    try:
        publisher.resume_publish(topic, ordering_key)
    except (RuntimeError, ValueError):
        LOG.debug("ordering key %r of %s was not paused", ordering_key, topic)


def _pull(subscriber: SubscriberLike, resource: _Resource, max_messages: int, max_wait: float) -> Sequence[Any]:
    """One synchronous pull; nothing within `max_wait` (empty response or DeadlineExceeded) is []."""
    try:
        response = subscriber.pull(
            subscription=resource.path, max_messages=max_messages, retry=None, timeout=max(max_wait, 0.001)
        )
    except api_errors.DeadlineExceeded:
        return []
    except Exception as error:
        _raise_mapped(error, resource, "pull")
    received: Sequence[Any] = response.received_messages
    return received


def _acknowledge(subscriber: SubscriberLike, resource: _Resource, ack_ids: Sequence[str], timeout: float) -> None:
    try:
        subscriber.acknowledge(subscription=resource.path, ack_ids=list(ack_ids), retry=None, timeout=timeout)
    except Exception as error:
        _raise_mapped(error, resource, "acknowledge")


def _ensure_allowed(
    client: PublisherLike | SubscriberLike, resource: _Resource, permission: str, timeout: float
) -> None:
    """testIamPermissions: answers which of the permissions the caller holds, with no side effect."""
    try:
        response = client.test_iam_permissions(
            request={"resource": resource.path, "permissions": [permission]}, retry=None, timeout=timeout
        )
    except Exception as error:
        _raise_mapped(error, resource, "test permissions")
    if permission not in list(response.permissions):
        raise TransportConfigError(
            f"the credentials lack {permission} on {resource}: grant {resource.role} on it to the VM's service account"
        )


def _ensure_topic(publisher: PublisherLike, resource: _Resource, timeout: float) -> None:
    try:
        publisher.get_topic(topic=resource.path, retry=None, timeout=timeout)
    except Exception as error:
        _raise_mapped(error, resource, "look up")


def _ensure_subscription(subscriber: SubscriberLike, resource: _Resource, timeout: float) -> None:
    try:
        subscriber.get_subscription(subscription=resource.path, retry=None, timeout=timeout)
    except Exception as error:
        _raise_mapped(error, resource, "look up")


def _with_envelope_id(message: OutboundMessage, **extra: str) -> dict[str, str]:
    attributes = dict(message.attributes)
    attributes["envelope_id"] = message.envelope_id
    attributes.update(extra)
    return attributes


# ---------------------------------------------------------------- receiving commands


class PubSubCommandReceiver(CommandReceiver):
    """Pulls this VM's commands from its subscription; drops (and acknowledges) other VMs' commands."""

    def __init__(self, clients: _Lazy, settings: PubSubSettings) -> None:
        self._clients = clients
        self._settings = settings
        self.resource = _Resource(
            "subscription",
            settings.subscription_path(settings.commands_subscription_name),
            "--pubsub-commands-subscription",
            SUBSCRIBER_ROLE,
        )

    def receive_commands(self, max_wait: float) -> Sequence[InboundCommand]:
        subscriber = self._clients.subscriber(self.resource)
        commands: list[InboundCommand] = []
        foreign: list[str] = []
        began = time.monotonic()
        pulled = _pull(subscriber, self.resource, MAX_COMMANDS_PER_PULL, max_wait)
        if not pulled:
            time.sleep(max(0.0, began + min(max_wait, MIN_EMPTY_PULL_SECONDS) - time.monotonic()))
        for received in pulled:
            attributes = dict(received.message.attributes)
            if attributes.get("target") != self._settings.vm_name:
                LOG.info(
                    "dropping a command for target %r on %s: this VM is %r (subscription filters are not applied)",
                    attributes.get("target"),
                    self.resource,
                    self._settings.vm_name,
                )
                foreign.append(received.ack_id)
                continue
            commands.append(self._command(subscriber, received, attributes))
        self._drop(subscriber, foreign)
        return commands

    def _command(self, subscriber: SubscriberLike, received: Any, attributes: dict[str, str]) -> InboundCommand:
        ack_id: str = received.ack_id
        attempt: int = received.delivery_attempt

        def settle() -> None:
            _acknowledge(subscriber, self.resource, [ack_id], self._settings.operation_timeout)

        return InboundCommand(
            body=bytes(received.message.data),
            attributes=attributes,
            settle=settle,
            # Pub/Sub counts delivery attempts only on subscriptions with a dead-letter policy; 0 otherwise.
            delivery_count=attempt or None,
        )

    def _drop(self, subscriber: SubscriberLike, ack_ids: list[str]) -> None:
        if not ack_ids:
            return
        try:
            _acknowledge(subscriber, self.resource, ack_ids, self._settings.operation_timeout)
        except (TransportUnavailableError, TransportConfigError) as error:
            # Not fatal: they come back after the ack deadline and are dropped again.
            LOG.warning("could not acknowledge %d dropped command(s): %s", len(ack_ids), error)


# ---------------------------------------------------------------- the agent's transport


class PubSubTransport(AgentTransport):
    """The agent's transport: publishes envelopes to the events topic, pulls this VM's commands."""

    name = "pubsub"

    def __init__(
        self,
        settings: PubSubSettings,
        *,
        publisher_factory: PublisherFactory = new_publisher,
        subscriber_factory: SubscriberFactory = new_subscriber,
        emulator: bool | None = None,
    ) -> None:
        """`emulator`: None = detect from PUBSUB_EMULATOR_HOST (decides how check() verifies)."""
        settings.validate()
        if not settings.vm_name.strip():
            raise TransportConfigError(
                "the pubsub transport needs this VM's name: commands are addressed to it (attribute target)"
            )
        self._settings = settings
        self._emulator = emulator_host() is not None if emulator is None else emulator
        self._clients = _Lazy(publisher_factory, subscriber_factory)
        self._events = _Resource("topic", settings.topic_path(settings.topic), "--pubsub-topic", PUBLISHER_ROLE)
        self._commands = PubSubCommandReceiver(self._clients, settings)

    def publish(self, message: OutboundMessage) -> None:
        publisher = self._clients.publisher(self._events)
        _publish(publisher, self._events, message, _with_envelope_id(message), self._settings.operation_timeout)

    @property
    def commands(self) -> CommandReceiver | None:
        return self._commands

    def check(self) -> str:
        timeout = self._settings.operation_timeout
        publisher = self._clients.publisher(self._events)
        subscriber = self._clients.subscriber(self._commands.resource)
        if self._emulator:
            # The emulator has no IAM (testIamPermissions is UNIMPLEMENTED): check existence instead.
            _ensure_topic(publisher, self._events, timeout)
            _ensure_subscription(subscriber, self._commands.resource, timeout)
            return f"pubsub (emulator {emulator_host()}): {self._events} and {self._commands.resource} exist"
        _ensure_allowed(publisher, self._events, PUBLISH_PERMISSION, timeout)
        _ensure_allowed(subscriber, self._commands.resource, CONSUME_PERMISSION, timeout)
        return f"pubsub: allowed to publish to {self._events} and to consume {self._commands.resource}"

    def close(self) -> None:
        self._clients.close()


# ---------------------------------------------------------------- the operator's side


class PubSubOperator(CommandSender, ResultReader):
    """What `mbridge approve` uses: publishes a command with attribute `target`, and reads command
    results from the events topic through the results subscription (acknowledging what it reads)."""

    def __init__(
        self,
        settings: PubSubSettings,
        *,
        publisher_factory: PublisherFactory = new_publisher,
        subscriber_factory: SubscriberFactory = new_subscriber,
        emulator: bool | None = None,
    ) -> None:
        settings.validate()
        self._settings = settings
        self._emulator = emulator_host() is not None if emulator is None else emulator
        self._clients = _Lazy(publisher_factory, subscriber_factory)
        self._commands = _Resource(
            "topic", settings.topic_path(settings.commands_topic), "the commands topic name", PUBLISHER_ROLE
        )
        self._results = _Resource(
            "subscription",
            settings.subscription_path(settings.results_subscription),
            "the results subscription name",
            SUBSCRIBER_ROLE,
        )

    def send_command(self, message: OutboundMessage) -> None:
        if not message.key:
            raise TransportConfigError("a command needs a target VM (the message key): it is the attribute target")
        publisher = self._clients.publisher(self._commands)
        attributes = _with_envelope_id(message, target=message.key)
        _publish(publisher, self._commands, message, attributes, self._settings.operation_timeout)

    def read_results(self, max_wait: float) -> Sequence[bytes]:
        subscriber = self._clients.subscriber(self._results)
        received = _pull(subscriber, self._results, MAX_RESULTS_PER_PULL, max_wait)
        if received:
            try:
                _acknowledge(
                    subscriber, self._results, [item.ack_id for item in received], self._settings.operation_timeout
                )
            except (TransportUnavailableError, TransportConfigError) as error:
                # What was pulled is still returned; the results come again after the ack deadline.
                LOG.warning("could not acknowledge %d command result(s): %s", len(received), error)
        return [bytes(item.message.data) for item in received]

    def check(self) -> str:
        timeout = self._settings.operation_timeout
        publisher = self._clients.publisher(self._commands)
        subscriber = self._clients.subscriber(self._results)
        if self._emulator:
            _ensure_topic(publisher, self._commands, timeout)
            _ensure_subscription(subscriber, self._results, timeout)
            return f"pubsub (emulator {emulator_host()}): {self._commands} and {self._results} exist"
        _ensure_allowed(publisher, self._commands, PUBLISH_PERMISSION, timeout)
        _ensure_allowed(subscriber, self._results, CONSUME_PERMISSION, timeout)
        return f"pubsub: allowed to publish to {self._commands} and to consume {self._results}"

    def close(self) -> None:
        self._clients.close()


# ---------------------------------------------------------------- construction


def build_agent_transport(settings: PubSubSettings) -> PubSubTransport:
    """The agent's Pub/Sub transport on the real library (validates the settings)."""
    return PubSubTransport(settings)


def build_operator(settings: PubSubSettings) -> PubSubOperator:
    """The `mbridge approve` side on the real library (validates the settings)."""
    return PubSubOperator(settings)


__all__ = [
    "EMULATOR_VARIABLE",
    "PubSubCommandReceiver",
    "PubSubOperator",
    "PubSubSettings",
    "PubSubTransport",
    "PublisherFactory",
    "PublisherLike",
    "SubscriberFactory",
    "SubscriberLike",
    "build_agent_transport",
    "build_operator",
    "emulator_host",
    "map_error",
    "new_publisher",
    "new_subscriber",
]
