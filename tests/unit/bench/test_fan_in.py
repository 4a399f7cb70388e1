"""The fan-in benchmark's synthetic reporters."""

from __future__ import annotations

from bench.fan_in import reporter_envelopes
from functions.core.envelope import decode
from functions.core.model import MaintenanceEvent


def _event(body: bytes) -> MaintenanceEvent:
    event = decode(body).data
    assert isinstance(event, MaintenanceEvent)
    return event


def test_fan_in_reporters_publish_one_id_for_one_event_of_the_first_vms() -> None:
    bodies, resources = reporter_envelopes(count=20, resources=5)

    envelopes = [decode(body) for body in bodies]
    assert len({envelope.id for envelope in envelopes}) == 1
    assert len(set(bodies)) == 20  # each reporter's own envelope
    assert resources == [f"vm-{index:04d}" for index in range(5)]
    assert all(_event(body).resources == tuple(resources) for body in bodies)
