"""The single calls the agent and the operator make: publish, pull, acknowledge, and the checks of
`--check`, each one attempt bounded by a timeout, its errors mapped; and the clients behind them,
created on first use.

Every call passes `retry=None`: the agent's loop retries with backoff, and with ordering enabled
(commands) the library would otherwise retry a publish forever.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from google.api_core import exceptions as api_errors
from google.auth import exceptions as auth_errors

from wire.transports.base import OutboundMessage, TransportConfigError
from wire.transports.pubsub.client import PublisherFactory, PublisherLike, SubscriberFactory, SubscriberLike
from wire.transports.pubsub.errors import Resource, raise_mapped

LOG = logging.getLogger("mbridge.transport.pubsub")

# How much longer than the RPC timeout to wait for a publish future (batching adds a few ms).
FUTURE_GRACE_SECONDS = 5.0

PUBLISH_PERMISSION = "pubsub.topics.publish"
CONSUME_PERMISSION = "pubsub.subscriptions.consume"


class Clients:
    """The publisher and subscriber, created on first use (constructing one reads credentials)."""

    def __init__(self, publisher_factory: PublisherFactory, subscriber_factory: SubscriberFactory) -> None:
        self._publisher_factory = publisher_factory
        self._subscriber_factory = subscriber_factory
        self._publisher: PublisherLike | None = None
        self._subscriber: SubscriberLike | None = None
        self._lock = threading.Lock()

    def publisher(self, resource: Resource) -> PublisherLike:
        with self._lock:
            if self._publisher is None:
                self._publisher = self._create(self._publisher_factory, resource)
            return self._publisher

    def subscriber(self, resource: Resource) -> SubscriberLike:
        with self._lock:
            if self._subscriber is None:
                self._subscriber = self._create(self._subscriber_factory, resource)
            return self._subscriber

    @staticmethod
    def _create(factory: Callable[[], Any], resource: Resource) -> Any:
        try:
            return factory()
        except auth_errors.GoogleAuthError as error:
            raise_mapped(error, resource, "create a Pub/Sub client")

    def close_subscriber(self) -> None:
        """Close the subscriber only; the next pull creates a new one."""
        with self._lock:
            subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            subscriber.close()

    def close(self) -> None:
        with self._lock:
            publisher, self._publisher = self._publisher, None
        if publisher is not None:
            try:
                publisher.stop()  # flushes what is batched; publish_message() already waited for everything it sent
            except RuntimeError:
                LOG.debug("the publisher was already stopped")
        self.close_subscriber()


def publish_message(
    publisher: PublisherLike,
    resource: Resource,
    message: OutboundMessage,
    attributes: Mapping[str, str],
    timeout: float,
    *,
    ordering_key: str,
) -> None:
    """Publish one message and wait until Pub/Sub has stored it; `ordering_key` "" publishes it unordered."""
    try:
        future = publisher.publish(
            resource.path, message.body, ordering_key=ordering_key, retry=None, timeout=timeout, **attributes
        )
        future.result(timeout=timeout + FUTURE_GRACE_SECONDS)
    except Exception as error:
        _resume(publisher, resource.path, ordering_key)
        raise_mapped(error, resource, "publish")


def _resume(publisher: PublisherLike, topic: str, ordering_key: str) -> None:
    # After a failed publish the library pauses the ordering key and fails every later message
    # with that key until resumed; the caller's retry republishes the same message, so order holds.
    if not ordering_key:
        return
    try:
        publisher.resume_publish(topic, ordering_key)
    except (RuntimeError, ValueError):
        LOG.debug("ordering key %r of %s was not paused", ordering_key, topic)


def pull(subscriber: SubscriberLike, resource: Resource, max_messages: int, max_wait: float) -> Sequence[Any]:
    """One synchronous pull; nothing within `max_wait` (empty response or DeadlineExceeded) is []."""
    try:
        response = subscriber.pull(
            subscription=resource.path, max_messages=max_messages, retry=None, timeout=max(max_wait, 0.001)
        )
    except api_errors.DeadlineExceeded:
        return []
    except Exception as error:
        raise_mapped(error, resource, "pull")
    received: Sequence[Any] = response.received_messages
    return received


def acknowledge(subscriber: SubscriberLike, resource: Resource, ack_ids: Sequence[str], timeout: float) -> None:
    try:
        subscriber.acknowledge(subscription=resource.path, ack_ids=list(ack_ids), retry=None, timeout=timeout)
    except Exception as error:
        raise_mapped(error, resource, "acknowledge")


def ensure_allowed(client: PublisherLike | SubscriberLike, resource: Resource, permission: str, timeout: float) -> None:
    """testIamPermissions: answers which of the permissions the caller holds, with no side effect."""
    try:
        response = client.test_iam_permissions(
            request={"resource": resource.path, "permissions": [permission]}, retry=None, timeout=timeout
        )
    except Exception as error:
        raise_mapped(error, resource, "test permissions")
    if permission not in list(response.permissions):
        raise TransportConfigError(
            f"the credentials lack {permission} on {resource}: grant {resource.role} on it to the VM's service account"
        )


def ensure_topic(publisher: PublisherLike, resource: Resource, timeout: float) -> None:
    try:
        publisher.get_topic(topic=resource.path, retry=None, timeout=timeout)
    except Exception as error:
        raise_mapped(error, resource, "look up")


def ensure_subscription(subscriber: SubscriberLike, resource: Resource, timeout: float) -> None:
    try:
        subscriber.get_subscription(subscription=resource.path, retry=None, timeout=timeout)
    except Exception as error:
        raise_mapped(error, resource, "look up")


def with_envelope_id(message: OutboundMessage, **extra: str) -> dict[str, str]:
    attributes = dict(message.attributes)
    attributes["envelope_id"] = message.envelope_id
    attributes.update(extra)
    return attributes
