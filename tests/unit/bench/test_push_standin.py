"""The stand-in for push delivery (bench/push_standin.py) keeps Pub/Sub's rule for ordering keys."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.push_standin import PushStandIn


@dataclass
class Message:
    ordering_key: str
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass
class Received:
    ack_id: str
    message: Message


@dataclass
class Response:
    received_messages: list[Received]


class OneBatchSubscriber:
    """Hands over `batch` on the first pull, nothing after; records the acknowledgements in order."""

    def __init__(self, batch: list[Received]) -> None:
        self._batch = batch
        self.acknowledged: list[str] = []
        self._lock = threading.Lock()

    def pull(self, *, subscription: str, max_messages: int, timeout: float, retry: Any) -> Response:
        with self._lock:
            batch, self._batch = self._batch, []
        if not batch:
            threading.Event().wait(0.01)
        return Response(batch)

    def acknowledge(self, *, subscription: str, ack_ids: Sequence[str], timeout: float) -> None:
        with self._lock:
            self.acknowledged.extend(ack_ids)


def junk_then_genuine(junk: int, genuine_key: str) -> list[Received]:
    batch = [Received(f"junk-{n}", Message("gce-0")) for n in range(junk)]
    return [*batch, Received("genuine", Message(genuine_key, {"genuine": "1"}))]


def run(batch: list[Received], *, ordered: bool, workers: int) -> tuple[PushStandIn, OneBatchSubscriber]:
    subscriber = OneBatchSubscriber(batch)
    functions = PushStandIn(subscriber, "s", ordered=ordered, workers=workers, handling_seconds=0.0)
    functions.start()
    try:
        assert functions.delivered.wait(10)
    finally:
        functions.stop()
    return functions, subscriber


def test_an_ordered_key_is_handed_over_one_message_at_a_time_in_order() -> None:
    # GIVEN ten junk messages of one key pulled before a genuine one of the same key
    functions, subscriber = run(junk_then_genuine(10, "gce-0"), ordered=True, workers=4)
    # THEN the genuine one is taken only once all ten were acknowledged, in the order pulled,
    # however many invocations are free
    assert functions.handled_before_delivery == 10
    assert subscriber.acknowledged[:10] == [f"junk-{n}" for n in range(10)]


def test_another_key_does_not_wait_behind_a_busy_lane() -> None:
    # GIVEN the same junk, a genuine message of another key, and one invocation
    functions, _ = run(junk_then_genuine(10, "gce-0.secret"), ordered=True, workers=1)
    # THEN it is taken right after the first junk message: the other nine wait in their own lane
    assert functions.handled_before_delivery == 1


def test_unordered_messages_are_handed_over_first_in_first_out() -> None:
    # GIVEN the same junk and a genuine message of the junk's own key, on an unordered subscription
    functions, _ = run(junk_then_genuine(10, "gce-0"), ordered=False, workers=1)
    # THEN all are handed over first in, first out, as pulled: the key holds nothing back, and
    # the genuine message comes after the backlog pulled before it
    assert functions.handled_before_delivery == 10
