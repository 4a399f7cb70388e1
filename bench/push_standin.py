"""A stand-in for the functions behind a Pub/Sub push subscription, over synchronous pull.

Pub/Sub pushes to the functions from many invocations at once, except that on a subscription
with message ordering on it keeps one message of an ordering key outstanding at a time: the next
one of that key is pushed only once the previous one was acknowledged. The emulator's own push
keeps two requests in flight per subscription, far fewer than the cloud, so this stand-in pulls
instead and plays the push rules itself:

- `workers` threads are that many invocations; each handles a message in `handling_seconds`
  (what the functions spend refusing an unverified message) and acknowledges it;
- `ordered`: messages with an ordering key go through their key's lane, one at a time, in the
  order pulled; otherwise every message is handled as soon as a worker is free.

The one message whose attribute `genuine` is set is timed: `delivered` is set when a worker takes it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any

from google.api_core import exceptions as api_errors

PULL_BATCH = 100
PULL_WAIT_SECONDS = 0.5
ADMIN_TIMEOUT = 30.0


class PushStandIn:
    def __init__(
        self, subscriber: Any, subscription: str, *, ordered: bool, workers: int, handling_seconds: float
    ) -> None:
        self._subscriber = subscriber
        self._subscription = subscription
        self._ordered = ordered
        self._handling_seconds = handling_seconds
        self._ready: queue.Queue[Any] = queue.Queue()
        self._lanes: dict[str, deque[Any]] = {}  # key → messages waiting behind the one being handled
        self._lanes_lock = threading.Lock()
        self._stop = threading.Event()
        self.delivered = threading.Event()
        self.delivered_at = 0.0
        self.handled_before_delivery = 0  # messages acknowledged before the genuine one was taken
        self._count_lock = threading.Lock()
        self._threads = [threading.Thread(target=self._pull, name="push-pull", daemon=True)]
        self._threads += [threading.Thread(target=self._work, name=f"push-{n}", daemon=True) for n in range(workers)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def _pull(self) -> None:
        while not self._stop.is_set():
            try:
                response = self._subscriber.pull(
                    subscription=self._subscription, max_messages=PULL_BATCH, timeout=PULL_WAIT_SECONDS, retry=None
                )
            except api_errors.DeadlineExceeded:
                continue
            # A batch is dispatched whole, in the order pulled: a lane freed meanwhile must not let
            # a later message of its key overtake the rest of the batch.
            with self._lanes_lock:
                for item in response.received_messages:
                    self._dispatch(item)

    def _dispatch(self, item: Any) -> None:
        """Hand `item` to the workers, or queue it behind its key's message being handled (lanes locked)."""
        key = item.message.ordering_key if self._ordered else ""
        if key:
            waiting = self._lanes.get(key)
            if waiting is not None:
                waiting.append(item)
                return
            self._lanes[key] = deque()
        self._ready.put(item)

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._ready.get(timeout=0.2)
            except queue.Empty:
                continue
            if item.message.attributes.get("genuine"):
                self.delivered_at = time.monotonic()
                self.delivered.set()
            time.sleep(self._handling_seconds)
            self._subscriber.acknowledge(subscription=self._subscription, ack_ids=[item.ack_id], timeout=ADMIN_TIMEOUT)
            with self._count_lock:
                if not self.delivered.is_set():
                    self.handled_before_delivery += 1
            self._next_of_lane(item)

    def _next_of_lane(self, item: Any) -> None:
        key = item.message.ordering_key if self._ordered else ""
        if not key:
            return
        with self._lanes_lock:
            waiting = self._lanes[key]
            if waiting:
                self._ready.put(waiting.popleft())
            else:
                del self._lanes[key]
