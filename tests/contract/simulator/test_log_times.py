"""The log's `unix_time`: the system-clock moment a change took effect, for timing clients across processes."""

from __future__ import annotations

import time

from tests.contract.simulator.conftest import StartSim, clients


def test_azure_change_is_stamped_on_the_system_clock_before_any_client_sees_it(start_sim: StartSim) -> None:
    # GIVEN an Azure simulator
    sim = start_sim(cloud="azure")
    vm = clients(sim)[0]
    # WHEN an event is added through the control API, and a client then reads the document
    before = time.time()
    added = vm.post_ok("events", {"event_type": "Reboot"})
    document = vm.events()
    seen_at = time.time()
    # THEN the entry for that change carries a microsecond system-clock stamp inside the request,
    # no later than the moment the client saw the event
    entry = next(e for e in sim.log_entries() if str(e["message"]).startswith(f"event {added['EventId']} added"))
    stamp = entry["unix_time"]
    assert isinstance(stamp, float)
    assert before <= stamp <= seen_at
    assert [e["EventId"] for e in document["Events"]] == [added["EventId"]]


def test_gce_change_is_stamped_on_the_system_clock(start_sim: StartSim) -> None:
    # GIVEN a GCE simulator whose maintenance-event was queried (so the warning is shown)
    sim = start_sim(cloud="gce")
    vm = clients(sim)[0]
    assert vm.gce("instance/maintenance-event").text == "NONE"
    # WHEN the value changes
    before = time.time()
    vm.post_ok("gce", {"key": "maintenance-event", "value": "MIGRATE_ON_HOST_MAINTENANCE"})
    after = time.time()
    # THEN its log entry is stamped between the request's start and its answer
    entry = next(
        e for e in sim.log_entries() if e["message"] == "maintenance-event: NONE -> MIGRATE_ON_HOST_MAINTENANCE"
    )
    stamp = entry["unix_time"]
    assert isinstance(stamp, float)
    assert before <= stamp <= after
    # AND every entry has the stamp, in order
    entries = sim.log_entries()
    stamps = [e["unix_time"] for e in entries if isinstance(e["unix_time"], float)]
    assert len(stamps) == len(entries)
    assert stamps == sorted(stamps)
