"""The shared background worker (wire/background.py), on real threads: a full queue drops its oldest
item, items are handled in order on one thread, settle and close are bounded even when the handler
hangs, and a handler that raises does not end the worker."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from wire.background import DropOldestWorker, DropReason

# Long enough never to be reached when the code works; a hang fails the test instead of the run.
PATIENCE = 10.0
_names = itertools.count()


class Handler:
    """Records what it handled, and on which thread; holds each item at `gate` while it is closed."""

    def __init__(self) -> None:
        self.handled: list[object] = []
        self.threads: set[int] = set()
        self.dropped: list[tuple[object, DropReason]] = []
        self.started = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()

    def __call__(self, item: object) -> None:
        self.started.set()
        assert self.gate.wait(PATIENCE), "the test never opened the gate"
        if item == "boom":
            raise RuntimeError("a handler that fails")
        with self.lock:
            self.handled.append(item)
            self.threads.add(threading.get_ident())

    def on_drop(self, item: object, reason: DropReason) -> None:
        with self.lock:
            self.dropped.append((item, reason))


@pytest.fixture
def handler() -> Iterator[Handler]:
    handler = Handler()
    yield handler
    handler.gate.set()  # a worker still held lets go, and its thread ends


def worker_for(handler: Handler, capacity: int = 100) -> tuple[DropOldestWorker[object], str]:
    name = f"test-background-{next(_names)}"
    return DropOldestWorker(handler, capacity=capacity, on_drop=handler.on_drop, name=name), name


def thread_named(name: str) -> threading.Thread | None:
    return next((thread for thread in threading.enumerate() if thread.name == name), None)


def test_a_full_queue_drops_its_oldest_waiting_item(handler: Handler) -> None:
    # GIVEN a worker held on its first item, with room for two more
    worker, _ = worker_for(handler, capacity=2)
    handler.gate.clear()
    worker.put(0)
    assert handler.started.wait(PATIENCE)
    # WHEN three more come
    for item in (1, 2, 3):
        worker.put(item)
    # THEN the one that waited longest (1) was dropped, as the queue was full
    assert handler.dropped == [(1, "full")]
    # AND once the worker goes on, the others are handled, in order
    handler.gate.set()
    assert worker.settle(PATIENCE)
    assert handler.handled == [0, 2, 3]


def test_items_are_handled_in_order_by_one_thread_of_its_own(handler: Handler) -> None:
    worker, name = worker_for(handler)
    assert thread_named(name) is None  # no thread before there is work
    for item in range(50):
        worker.put(item)
    assert worker.settle(PATIENCE)
    assert handler.handled == list(range(50))
    assert len(handler.threads) == 1
    assert threading.get_ident() not in handler.threads
    thread = thread_named(name)
    assert thread is not None
    assert thread.daemon
    assert handler.dropped == []


def test_settle_waits_for_the_item_being_handled(handler: Handler) -> None:
    # GIVEN an item that is being handled, held
    worker, _ = worker_for(handler)
    handler.gate.clear()
    worker.put("a")
    assert handler.started.wait(PATIENCE)
    # THEN settle runs out of time while it is held
    assert not worker.settle(0.05)
    # AND, once it may finish, settle returns True only when it is done
    handler.gate.set()
    assert worker.settle(PATIENCE)
    assert handler.handled == ["a"]


def test_close_gives_the_waiting_items_their_time_then_ends_the_thread(handler: Handler) -> None:
    worker, name = worker_for(handler)
    for item in range(5):
        worker.put(item)
    assert worker.close(PATIENCE)
    assert handler.handled == list(range(5))
    assert handler.dropped == []
    thread = thread_named(name)
    if thread is not None:  # it may have ended already
        thread.join(PATIENCE)
        assert not thread.is_alive()


def test_close_does_not_hang_on_a_handler_that_hangs(handler: Handler) -> None:
    # GIVEN a handler that hangs on its first item, and one more item waiting
    worker, name = worker_for(handler)
    handler.gate.clear()
    worker.put("hangs")
    assert handler.started.wait(PATIENCE)
    worker.put("waiting")
    # WHEN the worker is closed with a short timeout
    start = time.monotonic()
    settled = worker.close(0.1)
    # THEN close returns, saying not everything was done, and the waiting item was dropped
    assert not settled
    assert time.monotonic() - start < PATIENCE
    assert handler.dropped == [("waiting", "closed")]
    # AND an item given after close is dropped at once, never handled
    worker.put("late")
    assert handler.dropped == [("waiting", "closed"), ("late", "closed")]
    # AND once the hanging item ends, so does the thread, having handled nothing more
    handler.gate.set()
    thread = thread_named(name)
    assert thread is not None
    thread.join(PATIENCE)
    assert not thread.is_alive()
    assert handler.handled == ["hangs"]


def test_a_handler_that_raises_does_not_end_the_worker(handler: Handler, caplog: pytest.LogCaptureFixture) -> None:
    worker, name = worker_for(handler)
    with caplog.at_level(logging.ERROR, logger="mbridge.wire.background"):
        worker.put("boom")
        worker.put("after")
        assert worker.settle(PATIENCE)
    assert handler.handled == ["after"]
    assert f"the {name} worker failed on one item" in caplog.text
    assert "RuntimeError: a handler that fails" in caplog.text


def test_a_drop_is_reported_outside_the_lock(handler: Handler) -> None:
    # GIVEN an owner whose drop callback waits for another thread that asks the worker something
    # (a metrics scrape, say): that thread must not be kept waiting behind the caller of put
    asked = threading.Event()
    workers: list[DropOldestWorker[object]] = []

    def ask() -> None:
        workers[0].settle(0.0)
        asked.set()

    def on_drop(item: object, reason: DropReason) -> None:
        other = threading.Thread(target=ask)
        other.start()
        other.join(PATIENCE)
        handler.on_drop(item, reason)

    workers.append(DropOldestWorker(handler, capacity=1, on_drop=on_drop, name="test-background-lock"))
    handler.gate.clear()
    workers[0].put(0)
    assert handler.started.wait(PATIENCE)
    workers[0].put(1)
    # WHEN a full queue drops an item
    workers[0].put(2)
    # THEN the other thread got its answer while the callback ran
    assert asked.is_set()
    assert handler.dropped == [(1, "full")]


@pytest.mark.parametrize("capacity", [0, -1])
def test_a_queue_with_no_room_is_refused(capacity: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        DropOldestWorker(print, capacity=capacity, on_drop=lambda item, reason: None, name="none")


def test_the_items_waiting_can_be_taken_off_the_queue_oldest_first(handler: Handler) -> None:
    # GIVEN a worker held on its first item, with four more waiting
    handler.gate.clear()
    worker, _ = worker_for(handler)
    worker.put("first")
    assert handler.started.wait(PATIENCE)
    for item in ("a", "b", "c", "d"):
        worker.put(item)
    assert worker.waiting() == 4

    # WHEN three are taken (as a webhook digest takes those behind the notice it posts)
    taken = worker.take_waiting(3)

    # THEN they are the three oldest, and only the last is left for the worker
    assert taken == ["a", "b", "c"]
    assert worker.waiting() == 1
    handler.gate.set()
    assert worker.settle(PATIENCE)
    assert handler.handled == ["first", "d"]
    assert worker.take_waiting(5) == []
