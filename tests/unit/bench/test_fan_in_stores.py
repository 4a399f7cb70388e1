"""The fan-in on the cloud stores: the fleet's reports, their delivery order, and how the store's
requests are counted per step (the runs themselves need the emulators: `python -m bench`)."""

from __future__ import annotations

import threading

from bench.fan_in_stores import deliveries, fleet, own_only
from bench.store_counting import CountingAudit, CountingStore, RoundTrips
from functions.local_app.store import SqliteStore
from wire.envelope import decode
from wire.model import EventStatus, MaintenanceEvent


def _event(body: bytes) -> MaintenanceEvent:
    event = decode(body).data
    assert isinstance(event, MaintenanceEvent)
    return event


def test_every_reporter_sends_the_three_steps_and_own_keeps_the_vms_in_resources() -> None:
    every = fleet(20, 4)
    own = own_only(every)
    statuses = [{_event(body).status for body in step} for step in every.steps]
    assert statuses == [{EventStatus.SCHEDULED}, {EventStatus.STARTED}, {EventStatus.COMPLETED}]
    assert [len(step) for step in every.steps] == [20, 20, 20]
    assert [sorted(_event(body).reporter for body in step) for step in own.steps] == [every.resources] * 3


def test_each_step_is_delivered_whole_with_a_tenth_twice_before_the_next() -> None:
    steps = deliveries(fleet(20, 4))
    assert [len(step) for step in steps] == [22, 22, 22]
    assert [{_event(body).status for body in step} for step in steps] == [
        {EventStatus.SCHEDULED},
        {EventStatus.STARTED},
        {EventStatus.COMPLETED},
    ]


def test_requests_are_counted_under_the_step_and_envelope_kind_of_their_thread() -> None:
    counter = RoundTrips()

    class Requests(SqliteStore):
        """The local store, reporting one request per call as a cloud client's hook would."""

        def recall(self, key: str) -> bytes | None:
            counter.count(0)
            return super().recall(key)

        def remember(self, key: str, value: bytes) -> bytes:
            counter.count(1)
            return super().remember(key, value)

    inner = Requests(":memory:")
    store, audit = CountingStore(inner, counter), CountingAudit(inner, counter)
    with counter.envelope("scheduled own"):
        store.remember("k", b"v")
        store.recall("k")
    other = threading.Thread(target=lambda: counter.count(1))  # no step, no envelope on that thread
    other.start()
    other.join()
    assert counter.breakdown("scheduled own") == "end check 1 (0 w), remembered (approval, end) 1 (1 w)"
    assert counter.per_envelope("scheduled own") == (2.0, 1.0)
    assert counter.total() == (3, 2)
    assert audit.query() == []
    inner.close()
