"""The embedded bus deduplicates on the message id, so no VM's report can shadow another's."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from wire.transports.base import OutboundMessage
from wire.transports.local import LocalBus

OLD_SCHEMA = """
CREATE TABLE events (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    envelope_id  TEXT NOT NULL UNIQUE,
    key          TEXT NOT NULL,
    body         BLOB NOT NULL,
    attributes   TEXT NOT NULL,
    published_at REAL NOT NULL
);
CREATE TABLE positions (reader TEXT PRIMARY KEY, position INTEGER NOT NULL);
"""


def event(envelope_id: str, vm: str, body: bytes, message_id: str = "") -> OutboundMessage:
    return OutboundMessage(envelope_id=envelope_id, body=body, key=vm, message_id=message_id)


def test_reports_of_one_event_by_two_vms_are_both_kept_and_a_redelivery_is_not(tmp_path: Path) -> None:
    bus = LocalBus(tmp_path / "bus.db")
    # GIVEN web-0 and web-1 reporting the same event (the same envelope id), each with its own message id
    assert bus.publish_event(event("e" * 64, "web-0", b"web-0's report", message_id="m0"))
    assert bus.publish_event(event("e" * 64, "web-1", b"web-1's report", message_id="m1"))
    # WHEN web-0's message is delivered again
    assert not bus.publish_event(event("e" * 64, "web-0", b"web-0's report", message_id="m0"))
    # THEN both reports are on the bus, once each, with their envelope id
    assert [(e.key, e.envelope_id, e.body) for e in bus.read_events(0)] == [
        ("web-0", "e" * 64, b"web-0's report"),
        ("web-1", "e" * 64, b"web-1's report"),
    ]
    bus.close()


def test_a_message_without_its_own_id_is_deduplicated_on_its_envelope_id(tmp_path: Path) -> None:
    bus = LocalBus(tmp_path / "bus.db")
    assert bus.publish_event(event("c" * 64, "web-0", b"a command result"))
    assert not bus.publish_event(event("c" * 64, "web-0", b"a command result"))
    assert len(bus.read_events(0)) == 1
    bus.close()


def test_a_bus_file_of_an_earlier_version_keeps_its_events_and_positions(tmp_path: Path) -> None:
    # GIVEN a bus file that deduplicated on the envelope id, with two events and a reader's position
    path = tmp_path / "bus.db"
    old = sqlite3.connect(str(path))
    old.executescript(OLD_SCHEMA)
    old.executemany(
        "INSERT INTO events (envelope_id, key, body, attributes, published_at) VALUES (?, ?, ?, '{}', 1.0)",
        [("a" * 64, "web-0", b"first"), ("b" * 64, "web-0", b"second")],
    )
    old.execute("INSERT INTO positions VALUES ('functions', 1)")
    old.commit()
    old.close()

    # WHEN this version opens it (twice, as two processes would)
    bus, again = LocalBus(path), LocalBus(path)

    # THEN its events keep their sequence numbers, the position still points after the first, a
    # redelivery of an old event is still a duplicate, and a second report of it is not
    assert [(e.seq, e.envelope_id) for e in bus.read_events(0)] == [(1, "a" * 64), (2, "b" * 64)]
    assert [e.body for e in bus.read_events(bus.position("functions"))] == [b"second"]
    assert not again.publish_event(event("b" * 64, "web-0", b"second"))
    assert again.publish_event(event("b" * 64, "web-1", b"web-1's", message_id="m1"))
    bus.close()
    again.close()
