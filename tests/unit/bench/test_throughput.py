"""The throughput benchmark's workload: what it feeds the function core."""

from __future__ import annotations

from bench.throughput import OPEN_EVENTS, workload
from wire.envelope import decode
from wire.model import EventStatus, MaintenanceEvent


def _event(body: bytes) -> MaintenanceEvent:
    event = decode(body).data
    assert isinstance(event, MaintenanceEvent)
    return event


def test_throughput_rounds_pair_each_new_event_with_its_own_completion() -> None:
    # WHEN two rounds are built
    rounds = workload("t")
    first_scheduled, first_completed = next(rounds)
    second_scheduled, _ = next(rounds)

    # THEN a round opens OPEN_EVENTS distinct events, each for a VM of its own, and completes the same ones
    scheduled = [_event(body) for body in first_scheduled + second_scheduled]
    assert len(first_scheduled) == len(first_completed) == OPEN_EVENTS
    assert len({event.event_id for event in scheduled}) == 2 * OPEN_EVENTS
    assert len({event.reporter for event in scheduled}) == 2 * OPEN_EVENTS
    assert all(event.resources == (event.reporter,) for event in scheduled)
    completed = [_event(body) for body in first_completed]
    assert [event.event_id for event in completed] == [event.event_id for event in scheduled[:OPEN_EVENTS]]
    assert {event.status for event in completed} == {EventStatus.COMPLETED}
