"""Matching changes to what the agent and the reference poller saw, and when."""

from __future__ import annotations

import json
import random

import pytest

from bench.agent_detection import (
    Arrival,
    Change,
    Sighting,
    envelope_arrival,
    first_sightings,
    match_arrivals,
    parse_reference_output,
    random_gaps,
    shows,
)

EVENT = "c7061bac-afdc-4513-b24b-aa5f13a16123"


def test_gaps_are_drawn_within_their_bounds_and_repeat_with_the_seed() -> None:
    gaps = random_gaps(random.Random(7), 500, 1.05, 2.05)
    assert len(gaps) == 500
    assert all(1.05 <= gap < 2.05 for gap in gaps)
    # spread over the whole range (so a change falls at any phase of a 1 s poll cycle)
    assert min(gaps) < 1.15
    assert max(gaps) > 1.95
    assert gaps == random_gaps(random.Random(7), 500, 1.05, 2.05)


def test_gaps_refuse_an_upside_down_range() -> None:
    with pytest.raises(ValueError, match="low <= high"):
        random_gaps(random.Random(1), 3, 2.0, 1.0)


def test_each_change_takes_the_first_unused_arrival_with_its_key_after_it() -> None:
    # GIVEN GCE-like repeated keys: scheduled, completed, scheduled again
    changes = [
        Change(("live_migrate", "scheduled"), 10.0),
        Change(("live_migrate", "completed"), 10.3),
        Change(("live_migrate", "scheduled"), 10.6),
    ]
    arrivals = [
        Arrival(("live_migrate", "scheduled"), 9.0),  # before every change: answers none
        Arrival(("live_migrate", "scheduled"), 10.004),
        Arrival(("live_migrate", "completed"), 10.305),
        Arrival(("live_migrate", "scheduled"), 10.61),
    ]
    # WHEN they are matched
    latencies, unmatched = match_arrivals(changes, arrivals)
    # THEN every change has its own arrival, in milliseconds
    assert latencies == pytest.approx([4.0, 5.0, 10.0])
    assert unmatched == []


def test_a_change_without_an_arrival_is_reported_as_unmatched() -> None:
    changes = [Change((EVENT, "scheduled"), 1.0), Change((EVENT, "started"), 2.0)]
    latencies, unmatched = match_arrivals(changes, [Arrival((EVENT, "scheduled"), 1.5)])
    assert latencies == pytest.approx([500.0])
    assert unmatched == [changes[1]]


def test_a_document_shows_a_change_by_the_event_status_or_its_absence() -> None:
    scheduled = Sighting(1.0, {EVENT: "Scheduled"})
    started = Sighting(2.0, {EVENT: "Started"})
    empty = Sighting(3.0, {})
    assert shows(Change((EVENT, "scheduled"), 0.0), scheduled)
    assert not shows(Change((EVENT, "started"), 0.0), scheduled)
    assert shows(Change((EVENT, "started"), 0.0), started)
    assert shows(Change((EVENT, "completed"), 0.0), empty)
    assert not shows(Change((EVENT, "completed"), 0.0), started)


def test_first_sighting_skips_documents_parsed_after_the_change_that_do_not_show_it() -> None:
    # GIVEN a document fetched just before the change but parsed just after it, then one that shows it
    change = Change((EVENT, "started"), 5.0)
    sightings = [Sighting(5.001, {EVENT: "Scheduled"}), Sighting(5.9, {EVENT: "Started"})]
    latencies, unseen = first_sightings([change], sightings)
    assert latencies == pytest.approx([900.0])
    assert unseen == []
    _, unseen = first_sightings([Change((EVENT, "completed"), 6.0)], sightings)
    assert len(unseen) == 1


def test_reference_output_keeps_the_document_records_and_skips_the_samples_log_lines() -> None:
    lines = [
        json.dumps({"seen_at": 1.5, "incarnation": 2, "events": [["C7061BAC-AFDC-4513-B24B-AA5F13A16123", "Started"]]}),
        "Virtual machine is going to be restarted because of host maintenance.",
        json.dumps({"seen_at": 2.5, "incarnation": 3, "events": []}),
    ]
    assert parse_reference_output(lines) == [Sighting(1.5, {EVENT: "Started"}), Sighting(2.5, {})]


def test_an_envelope_stands_for_its_event_and_status() -> None:
    azure = {"data": {"cloud": "azure", "event_id": EVENT.upper(), "kind": "reboot", "status": "scheduled"}}
    gce = {"data": {"cloud": "gce", "event_id": "ab12", "kind": "live_migrate", "status": "completed"}}
    result = {"data": {"command_id": "x", "result": "accepted"}}
    assert envelope_arrival(json.dumps(azure).encode(), 7.0, cloud="azure") == Arrival((EVENT, "scheduled"), 7.0)
    assert envelope_arrival(json.dumps(gce).encode(), 8.0, cloud="gce") == Arrival(("live_migrate", "completed"), 8.0)
    assert envelope_arrival(json.dumps(result).encode(), 9.0, cloud="azure") is None
    assert envelope_arrival(json.dumps(gce).encode(), 8.0, cloud="azure") is None
