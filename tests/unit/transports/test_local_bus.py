"""The embedded bus deduplicates on the message id, so no VM's report can shadow another's."""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from pathlib import Path

from wire.transports.base import OutboundMessage, TransportUnavailableError
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


def test_threads_sharing_one_bus_do_not_fail_while_another_connection_writes(tmp_path: Path) -> None:
    # GIVEN one bus shared by threads, as an agent's publisher and command threads share it (and a
    # process of the fleet benchmark's agents shares one), and another connection writing, as the
    # function host does. A query whose rows were read after the lock was let go left its
    # statement open while another thread wrote on the connection: that write met a snapshot
    # older than the other connection's commit and failed at once ("database is locked"), and a
    # result or a settle was lost (the fleet benchmark at c79932d: 3 results of its 1,000-event wave
    # never reached the bus, 9 commands stayed unsettled).
    path = tmp_path / "bus.db"
    shared = LocalBus(path)
    host = LocalBus(path)
    for index in range(50):
        assert host.send_command(event(f"c{index}", f"web-{index % 10}", b"{}"))
    errors: Counter[str] = Counter()
    done = threading.Event()

    def agents(thread: int) -> None:
        for step in range(800):
            try:
                if step % 8 == 0:
                    shared.publish_event(event(f"r{thread}-{step}", f"web-{thread}", f"{thread}-{step}".encode()))
                elif step % 8 == 4:
                    shared.settle_command(step % 50 + 1)
                else:
                    shared.open_commands(f"web-{step % 10}")
            except TransportUnavailableError as exc:
                errors[str(exc)] += 1

    def functions() -> None:
        step = 0
        while not done.is_set():
            step += 1
            host.publish_event(event(f"h{step}", "host", f"h{step}".encode()))

    writer = threading.Thread(target=functions)
    writer.start()
    threads = [threading.Thread(target=agents, args=(thread,)) for thread in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    done.set()
    writer.join(60)

    # THEN no call failed: every query is read whole under the lock
    assert not errors
    shared.close()
    host.close()
