"""Drill 7: 10,000 Scheduled Events documents mixing valid and odd entries, read by the agent's own
reading path (parser → tracker → envelope), with restarts and stretches the agent does not see.

A seeded world of events moves through its lifecycle, one documented second per document: events
for this VM and for others appear Scheduled (or already Started), start at their NotBefore, are
removed after a while, and some are canceled before they start. Every document also carries odd
entries — types, statuses and sources Azure may add, dates in other formats, garbled fields, entries
without an EventId, repeated EventIds, entries that are not objects — and now and then the whole
body is garbage. Every few hundred documents the agent restarts from its saved state, sometimes after
missing a stretch of documents (it was down).

Properties: nothing but a garbage body is refused; every valid entry concerning this VM is forwarded
from the first document that shows it, at the step that document shows; every such event that goes
away gets exactly one end, `canceled` only when Azure canceled it; no (event, status) is forwarded
twice; every envelope decodes at the functions' decoder, odd entries as kind `unknown` or with their
unreadable fields named.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from agent.messages import event_message
from agent.sources.azure.client import AzureObservation
from agent.sources.azure.diff import azure_state_from_json, azure_state_to_json
from agent.sources.azure.document import parse_scheduled_events
from agent.sources.azure.tracker import AzureTracker
from tests.drills.conftest import drill_seed, say
from wire.envelope import decode
from wire.errors import MalformedDocumentError
from wire.model import EventKind, MaintenanceEvent
from wire.timefmt import format_rfc1123, format_rfc3339

pytestmark = [pytest.mark.drill, pytest.mark.timeout(120)]

DOCUMENTS = 10_000
ME = "vm-me"
OTHERS = ("vm-1", "vm-2", "vm-3")
START = datetime(2026, 11, 25, 0, 0, tzinfo=timezone.utc)
TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")


@dataclass
class WorldEvent:
    """One genuine event of the simulated Azure: its truth, and how it ended."""

    event_id: str
    event_type: str
    resources: list[str]
    not_before: datetime
    status: str = "Scheduled"
    ends_at: datetime | None = None  # Started events are removed then
    iso_not_before: bool = False  # printed as some IMDS emulators do

    def entry(self) -> dict[str, Any]:
        not_before = ""
        if self.status == "Scheduled":
            not_before = format_rfc3339(self.not_before) if self.iso_not_before else format_rfc1123(self.not_before)
        return {
            "EventId": self.event_id,
            "EventType": self.event_type,
            "ResourceType": "VirtualMachine",
            "Resources": self.resources,
            "EventStatus": self.status,
            "NotBefore": not_before,
            "Description": "Host server is undergoing maintenance.",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }


class World:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.now = START
        self.live: dict[str, WorldEvent] = {}
        self.ended: dict[str, str] = {}  # EventId -> "completed" | "canceled", the truth

    def tick(self) -> None:
        self.now += timedelta(seconds=1)
        for event in list(self.live.values()):
            if event.status == "Scheduled" and self.now >= event.not_before:
                event.status = "Started"
                event.ends_at = self.now + timedelta(seconds=self.rng.randint(2, 120))
            elif event.status == "Started" and event.ends_at is not None and self.now >= event.ends_at:
                self._end(event, "completed")
            elif event.status == "Scheduled" and self.rng.random() < 0.002:
                self._end(event, "canceled")  # Azure cancels by removing a Scheduled event
        if self.rng.random() < 0.03:
            self._add()

    def _add(self) -> None:
        rng = self.rng
        audience = [ME] if rng.random() < 0.5 else []
        audience += rng.sample(OTHERS, rng.randint(0 if audience else 1, 2))
        event = WorldEvent(
            event_id=str(uuid.UUID(int=rng.getrandbits(128))).upper(),
            event_type=rng.choice(TYPES),
            resources=audience,
            not_before=self.now + timedelta(seconds=rng.randint(5, 900)),
            iso_not_before=rng.random() < 0.2,
        )
        if rng.random() < 0.05:  # a hardware failure: already Started, no notice
            event.status, event.ends_at = "Started", self.now + timedelta(seconds=rng.randint(2, 120))
        self.live[event.event_id] = event

    def _end(self, event: WorldEvent, how: str) -> None:
        del self.live[event.event_id]
        self.ended[event.event_id] = how

    def document(self, incarnation: int) -> str:
        """The document IMDS serves now: the genuine entries mixed with odd ones, in any order."""
        rng = self.rng
        if rng.random() < 0.01:
            return rng.choice(['{"DocumentIncarnation": 1, "Even', "<html>502</html>", '{"Events": []}', "[]", ""])
        entries: list[Any] = [event.entry() for event in self.live.values()]
        for _ in range(rng.randint(0, 3)):
            entries.append(odd_entry(rng, entries))
        rng.shuffle(entries)
        # A repeated EventId keeps the first entry: a copy of a genuine one goes after it.
        if entries and rng.random() < 0.05:
            genuine = [e for e in entries if isinstance(e, dict) and e.get("EventId") in self.live]
            if genuine:
                entries.append(dict(rng.choice(genuine), EventStatus="Garbled"))
        return json.dumps({"DocumentIncarnation": incarnation, "Events": entries})


ODD_FIELDS: list[tuple[str, Any]] = [
    ("EventType", "Hibernate"),
    ("EventType", None),
    ("EventType", 7),
    ("EventType", "REBOOT"),
    ("EventStatus", "Completed"),
    ("EventStatus", ["Scheduled"]),
    ("EventStatus", "started"),
    ("EventSource", "Cosmic"),
    ("NotBefore", "tomorrow"),
    ("NotBefore", 1_700_000_000),
    ("NotBefore", "2026-11-25T00:00:00"),
    ("NotBefore", "Fri, 31 Dec 9999 23:59:59 -2359"),
    ("Resources", "vm-me"),
    ("Resources", [ME, 7, None]),
    ("DurationInSeconds", "²"),
    ("DurationInSeconds", True),
    ("Description", {"text": "x"}),
    ("NewFieldFrom2030", {"nested": [1, 2]}),
    ("EventId", ""),
    ("EventId", None),
    ("EventId", 12),
]


def odd_entry(rng: random.Random, others: list[Any]) -> Any:
    """An entry this release cannot fully read (or no entry at all)."""
    if rng.random() < 0.05:
        return rng.choice(["an entry", 42, None, [1, 2]])
    entry = WorldEvent(
        event_id=f"odd-{rng.getrandbits(32):08x}",
        event_type=rng.choice(TYPES),
        resources=rng.choice([[ME], ["vm-1"], [ME, "vm-2"]]),
        not_before=START + timedelta(days=1),
    ).entry()
    for field, value in rng.sample(ODD_FIELDS, rng.randint(1, 3)):
        entry[field] = value
    return entry


@dataclass
class Forwarded:
    events: list[MaintenanceEvent]
    refused: int = 0


def test_ten_thousand_odd_documents_lose_nothing_for_this_vm() -> None:
    rng = random.Random(drill_seed(13))
    world = World(rng)
    started = time.monotonic()
    tracker = AzureTracker(ME, None)
    forwarded = Forwarded(events=[])
    first_seen: dict[str, str] = {}  # EventId -> the step the first document showing it had
    not_before: dict[str, datetime] = {}
    gone_seen_at: dict[str, datetime] = {}  # when the agent first read a document without it
    restarts = missed = 0
    incarnation = 0
    for _ in range(DOCUMENTS):
        world.tick()
        if rng.random() < 0.004:
            # The agent restarts from its saved state, after missing up to ten minutes of documents.
            restarts += 1
            for _ in range(rng.randint(0, 600)):
                world.tick()
                missed += 1
            tracker = AzureTracker(ME, json.loads(json.dumps(azure_state_to_json(tracker.state))))
        incarnation += 1
        try:
            document = parse_scheduled_events(world.document(incarnation))
        except MalformedDocumentError:
            forwarded.refused += 1
            continue
        for genuine in world.live.values():
            if ME in genuine.resources and genuine.event_id not in first_seen:
                first_seen[genuine.event_id] = "started" if genuine.status == "Started" else "scheduled"
                not_before[genuine.event_id] = genuine.not_before
        for event_id in first_seen.keys() - world.live.keys() - gone_seen_at.keys():
            gone_seen_at[event_id] = world.now
        applied = tracker.apply(AzureObservation(document=document, observed_at=world.now, lag_bound=0.0))
        tracker.commit(applied)
        forwarded.events.extend(applied.events)

    # THEN every envelope decodes at the functions, and no fact is forwarded twice
    for sent in forwarded.events:
        assert decode(event_message(sent, world.now).body).data == sent, sent
    facts = Counter((e.event_id.lower(), e.status.value) for e in forwarded.events)
    assert max(facts.values()) == 1, [fact for fact, count in facts.items() if count > 1][:5]

    # THEN every genuine event for this VM was forwarded at the step its first document showed
    mine = [e for e in forwarded.events if e.event_id in first_seen]
    beginnings: dict[str, str] = {}
    for step in mine:
        beginnings.setdefault(step.event_id, step.status.value)
    first_steps = {event_id: beginnings.get(event_id) for event_id in first_seen}
    assert first_steps == first_seen, {k: v for k, v in first_steps.items() if v != first_seen[k]}

    # THEN every one that ended was ended once, canceled only when Azure canceled it. A cancellation
    # the agent finds only after the NotBefore (it was down) is reported completed: nothing tells it
    # apart from an event that ran, and "completed" never puts a deleted VM back.
    ends = {e.event_id: e.status.value for e in mine if e.status.value in ("completed", "canceled")}
    truth = {event_id: world.ended[event_id] for event_id in first_seen if event_id in world.ended}
    expected = {
        event_id: "canceled" if how == "canceled" and gone_seen_at[event_id] < not_before[event_id] else "completed"
        for event_id, how in truth.items()
    }
    assert ends == expected, {k: (ends.get(k), v) for k, v in expected.items() if ends.get(k) != v}

    # THEN the odd entries were forwarded too, as far as they could be read
    odd = [e for e in forwarded.events if e.event_id.startswith("odd-")]
    assert any(e.kind is EventKind.UNKNOWN for e in odd), "an unknown EventType is forwarded as kind unknown"
    assert {name for e in odd for name in e.unreadable} >= {"EventType", "EventStatus", "NotBefore", "Resources"}
    assert azure_state_from_json(azure_state_to_json(tracker.state)).keys() == tracker.state.keys()
    say(
        "odd-documents",
        documents=DOCUMENTS,
        refused_garbage=forwarded.refused,
        envelopes=len(forwarded.events),
        events_for_this_vm=len(first_seen),
        ended_for_this_vm=len(truth),
        canceled_for_this_vm=sum(1 for how in truth.values() if how == "canceled"),
        canceled_found_after_not_before=sum(1 for k, how in truth.items() if how != expected[k]),
        odd_envelopes=len(odd),
        restarts=restarts,
        documents_missed_while_down=missed,
        duration_s=round(time.monotonic() - started, 1),
    )
