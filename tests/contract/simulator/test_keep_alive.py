"""Answers on kept-alive connections come without Nagle's delay, as from the real metadata services."""

from __future__ import annotations

import statistics
import threading
import time

import requests

from tests.contract.simulator.conftest import FLAVOR, METADATA, StartSim

# Nagle's algorithm holding the body until the client's delayed ACK of the headers costs about
# 40 ms per answer on Linux; without it a loopback answer takes a millisecond or two.
NAGLE_DELAY_MS = 40.0


def test_polls_on_one_connection_are_not_delayed(start_sim: StartSim) -> None:
    # GIVEN an Azure simulator and a client that keeps its connection (as the agent does)
    sim = start_sim(cloud="azure")
    url = f"{sim.base_urls[0]}/metadata/scheduledevents"
    took = []
    with requests.Session() as session:
        # WHEN it polls ten times over that connection
        for _ in range(10):
            started = time.perf_counter()
            response = session.get(url, params={"api-version": "2020-07-01"}, headers=METADATA, timeout=10)
            took.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
    # THEN a typical answer takes far less than the delay Nagle's algorithm would add
    assert statistics.median(took) < NAGLE_DELAY_MS / 2, took


def test_long_poll_answers_as_soon_as_the_value_changes(start_sim: StartSim) -> None:
    # GIVEN a GCE simulator and a long-poll waiting on a kept-alive connection
    sim = start_sim(cloud="gce")
    url = f"{sim.base_urls[0]}/computeMetadata/v1/instance/maintenance-event"
    with requests.Session() as session:
        etag = session.get(url, headers=FLAVOR, timeout=10).headers["ETag"]
        answered: list[float] = []

        def long_poll() -> None:
            params = {"wait_for_change": "true", "last_etag": etag, "timeout_sec": "30"}
            session.get(url, params=params, headers=FLAVOR, timeout=40)
            answered.append(time.time())

        waiter = threading.Thread(target=long_poll)
        waiter.start()
        time.sleep(0.3)
        # WHEN the value changes
        changed = requests.post(
            f"{sim.base_urls[0]}/_sim/gce",
            json={"key": "maintenance-event", "value": "MIGRATE_ON_HOST_MAINTENANCE"},
            timeout=10,
        )
        waiter.join(timeout=40)
    # THEN the long-poll's answer arrives well within Nagle's delay of the change's moment
    assert changed.json()["shown"] is True
    entry = next(e for e in sim.log_entries() if str(e["message"]).startswith("maintenance-event: NONE ->"))
    changed_at = entry["unix_time"]
    assert isinstance(changed_at, float)
    assert answered
    assert (answered[0] - changed_at) * 1000 < NAGLE_DELAY_MS / 2
