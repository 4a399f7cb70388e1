"""What the local functions took, written down as `mbridge replay` reads it (functions/local_app/recording.py):
each input with the time the functions took it, in the order they took it."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from functions.core.central import EVENT_GRID, CentralReport
from functions.core.policy import Policy
from functions.local_app.host import LocalFunctionHost
from functions.local_app.recording import (
    CentralReceived,
    NotRecordedError,
    Received,
    Recorder,
    Sweep,
    format_received,
    recorded,
)
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock
from wire.envelope import decode, encode, envelope_for_event
from wire.identity import ReporterName
from wire.model import Cloud, EventKind, EventStatus
from wire.transports.base import OutboundMessage
from wire.transports.local import LocalBus

NOW = datetime(2026, 3, 1, 12, 0, 0, 250_123, tzinfo=timezone.utc)


def read_back(path: Path) -> list[object]:
    return [recorded(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_host_records_each_message_with_the_time_it_processed_it_at(tmp_path: Path) -> None:
    # GIVEN the local host with a recorder, on a clock that moves between its steps
    clock = FakeClock(NOW)
    bus, store = LocalBus(tmp_path / "bus.db"), SqliteStore(tmp_path / "functions.db")
    recorder = Recorder(tmp_path / "recorded.jsonl")
    host = LocalFunctionHost(
        bus, store, FakeBalancer({"web": ["web-0"]}), Policy(), clock.now, verifier=ReporterName(), recorder=recorder
    )
    scheduled = encode(envelope_for_event(azure_event(reporter="web-0", resources=("web-0",)), NOW))
    garbage = b"not an envelope"
    try:
        # WHEN a report is taken, then (later) a message that is not an envelope
        bus.publish_event(OutboundMessage("a" * 64, scheduled, "web-0"))
        host.step()
        clock.advance(timedelta(seconds=90))
        bus.publish_event(OutboundMessage("b" * 64, garbage, "web-0"))
        host.step()
    finally:
        recorder.close()
        bus.close()
        store.close()

    # THEN both are written down, each with the time the host processed it at, as they came: the report
    # as its JSON object (readable, and the same message for its proof), the other as its text
    report, other = read_back(tmp_path / "recorded.jsonl")
    assert isinstance(report, Received)
    assert report.at == NOW
    assert json.loads(report.body) == json.loads(scheduled)
    assert decode(report.body).digest == decode(scheduled).digest
    assert other == Received(NOW + timedelta(seconds=90), garbage)
    first = json.loads((tmp_path / "recorded.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert first == {"received_at": "2026-03-01T12:00:00.250123Z", "envelope": json.loads(scheduled)}


def test_control_plane_reports_are_recorded_one_line_per_vm_and_sweeps_with_their_time(tmp_path: Path) -> None:
    # GIVEN a report of Event Grid naming two VMs, and a sweep a minute later
    report = CentralReport(
        cloud=Cloud.AZURE,
        event_id="5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7",
        kind=EventKind.REBOOT,
        status=EventStatus.SCHEDULED,
        vms=("web-0", "web-1"),
        source=EVENT_GRID,
        notice_id="n-1",
        not_before=datetime(2026, 3, 1, 12, 15, tzinfo=timezone.utc),
        identities=(("web-0", "/subscriptions/s/vm/web-0"), ("web-1", "/subscriptions/s/vm/web-1")),
    )
    recorder = Recorder(tmp_path / "recorded.jsonl")
    recorder.central(report, NOW)
    recorder.sweep(NOW + timedelta(minutes=1))
    recorder.close()

    # THEN each VM's part reads back as the part the core acts on, and the sweep with its time
    first, second, sweep = read_back(tmp_path / "recorded.jsonl")
    assert isinstance(first, CentralReceived)
    assert isinstance(second, CentralReceived)
    assert (first.at, first.report.vms, second.report.vms) == (NOW, ("web-0",), ("web-1",))
    # (but for what the part says of the report it came from: how many VMs it named)
    assert replace(first.report.part("web-0"), raw={}) == replace(report.part("web-0"), raw={})
    assert second.report.identity("web-1") == "/subscriptions/s/vm/web-1"
    assert sweep == Sweep(NOW + timedelta(minutes=1))


def test_a_bare_envelope_is_no_record() -> None:
    envelope = json.loads(encode(envelope_for_event(azure_event(), NOW)))
    assert recorded(envelope) is None
    assert recorded([envelope]) is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"received_at": "yesterday", "sweep": True}, "received_at: 'yesterday' is not an RFC 3339 timestamp"),
        ({"received_at": format_received(NOW)}, "one of envelope, central or sweep"),
        ({"received_at": format_received(NOW), "sweep": True, "envelope": {}}, "one of envelope, central or sweep"),
        ({"received_at": format_received(NOW), "central": {"vm": "web-0"}}, "central: not a control-plane report"),
    ],
    ids=["time", "nothing", "two", "central"],
)
def test_a_record_that_is_not_one_says_why(line: dict[str, object], message: str) -> None:
    with pytest.raises(NotRecordedError, match=message):
        recorded(line)
