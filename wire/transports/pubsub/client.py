"""The library surface the Pub/Sub transport uses, and the real clients behind it.

The library ships no type information; these protocols name the calls the transport makes, so
that the code type-checks and a test can substitute the network edge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable, Protocol

import google.cloud.pubsub_v1 as pubsub_v1  # type: ignore[import-untyped]  # the library ships no py.typed


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


def new_events_publisher() -> PublisherLike:
    """The agent's publisher of events, without message ordering.

    Every agent may publish to the events topic and an ordering key is whatever the publisher
    writes: keyed with a VM's name, the events of that VM would share an ordering lane that any
    agent can fill with junk the functions must take one at a time before the genuine event
    (docs/transports.md#why-events-carry-no-ordering-key). The functions do not need the order.
    """
    publisher: PublisherLike = pubsub_v1.PublisherClient()
    return publisher


def new_commands_publisher() -> PublisherLike:
    """The publisher of commands (the functions, `mbridge approve`), with message ordering: each VM's
    command subscription delivers its commands in order (a `drain` before its `approve`), and only
    the functions and the operators may publish to the commands topic, so no agent can fill a lane."""
    publisher: PublisherLike = pubsub_v1.PublisherClient(
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    return publisher


def new_subscriber() -> SubscriberLike:
    subscriber: SubscriberLike = pubsub_v1.SubscriberClient()
    return subscriber
