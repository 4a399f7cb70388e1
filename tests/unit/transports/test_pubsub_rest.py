"""A resting Pub/Sub agent closes its subscriber and pulls nothing; the publisher is left alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wire.transports.pubsub.settings import PubSubSettings
from wire.transports.pubsub.transport import PubSubTransport


@dataclass
class Pulled:
    received_messages: list[Any] = field(default_factory=list)


@dataclass
class FakeSubscriber:
    pulls: int = 0
    closed: bool = False

    def pull(self, **_: Any) -> Pulled:
        self.pulls += 1
        return Pulled()

    def close(self) -> None:
        self.closed = True


@dataclass
class FakePublisher:
    stopped: bool = False

    def stop(self) -> None:
        self.stopped = True


def test_rest_closes_the_subscriber_only_and_the_next_pull_makes_a_new_one() -> None:
    subscribers: list[FakeSubscriber] = []
    publishers: list[FakePublisher] = []

    def new_subscriber() -> FakeSubscriber:
        subscribers.append(FakeSubscriber())
        return subscribers[-1]

    def new_publisher() -> FakePublisher:
        publishers.append(FakePublisher())
        return publishers[-1]

    settings = PubSubSettings(project="p", vm_name="gce-0")
    # The fakes carry only what this path calls; the factories' types name the whole client.
    transport = PubSubTransport(
        settings,
        publisher_factory=new_publisher,  # type: ignore[arg-type]
        subscriber_factory=new_subscriber,  # type: ignore[arg-type]
        emulator=True,
    )
    receiver = transport.commands
    assert receiver is not None
    assert receiver.receive_commands(0.0) == []
    transport._clients.publisher(transport._events)  # the publisher exists, as after a publish

    transport.rest()

    assert subscribers[0].closed
    assert not publishers[0].stopped
    assert receiver.receive_commands(0.0) == []
    assert len(subscribers) == 2
    assert subscribers[1].pulls == 1
    assert len(publishers) == 1
    transport.close()
    assert publishers[0].stopped
    assert subscribers[1].closed
