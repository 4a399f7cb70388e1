"""The agent against a misbehaving metadata service and a bus that goes away: no crash, no loss,
no burst above IMDS's 5 requests/s, and every envelope still delivered in order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from simulator import Simulator
from tests.agent_runner import AgentThread, settings_for
from tests.waiting import wait_until
from wire.transports.base import OutboundMessage, TransportUnavailableError
from wire.transports.jsonl import JsonlTransport

EVENT = {"event_type": "Reboot", "resources": ["vm-0"], "event_id": "E1"}


def control(sim: Simulator, path: str, body: dict[str, Any]) -> Any:
    response = requests.post(f"{sim.base_urls[0]}/_sim/{path}", json=body, timeout=5)
    assert response.status_code < 300, response.text
    return response.json()


@pytest.mark.slow
def test_429_storm_and_503_burst_do_not_stop_the_agent_nor_push_it_over_5_per_second(
    tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    # GIVEN IMDS with its rate limit on, answering the next 5 requests 429 and then 3 with 503
    with Simulator(cloud="azure", vm_names=["vm-0"]) as sim:
        control(sim, "faults", {"rate_limit": True, "error_burst": {"status": 429, "count": 5}})
        agent = agent_thread(settings_for("azure", sim.base_urls[0], "vm-0", tmp_path))
        wait_until(lambda: sim.traffic()["vm-0"]["by_status"].get("429", 0) >= 5, 60, "the 429 storm")
        control(sim, "faults", {"error_burst": {"status": 503, "count": 3}})
        wait_until(lambda: sim.traffic()["vm-0"]["by_status"].get("503", 0) >= 3, 60, "the 503 burst")

        # WHEN an event appears after the storm
        control(sim, "events", EVENT)

        # THEN the agent reports it, and never sent more than 5 requests in any second
        envelopes = agent.wait_for_count(1, timeout=30)
        traffic = sim.traffic()["vm-0"]
    assert [e["data"]["status"] for e in envelopes] == ["scheduled"]
    assert traffic["max_per_second"] <= 5, traffic
    assert agent.thread is not None
    assert agent.thread.is_alive()


@pytest.mark.slow
def test_garbage_slow_and_dropped_answers_lose_nothing(
    tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    # GIVEN an event, and IMDS that answers slowly, drops connections and sends broken JSON
    with Simulator(cloud="azure", vm_names=["vm-0"]) as sim:
        control(sim, "faults", {"latency_ms": 300, "drop": 2, "malformed": 2})
        control(sim, "events", EVENT)
        agent = agent_thread(settings_for("azure", sim.base_urls[0], "vm-0", tmp_path))

        # WHEN the event starts and completes while the faults play out
        agent.wait_for_count(1, timeout=30)
        requests.post(f"{sim.base_urls[0]}/_sim/events/E1/advance", timeout=5)
        agent.wait_for_count(2, timeout=30)
        requests.post(f"{sim.base_urls[0]}/_sim/events/E1/advance", timeout=5)
        agent.wait_for_count(3, timeout=30)
        by_status = sim.traffic()["vm-0"]["by_status"]

    # THEN every step was reported once, in order, and the faults really happened
    assert [e["data"]["status"] for e in agent.envelopes()] == ["scheduled", "started", "completed"]
    assert by_status.get("dropped", 0) == 2


class FlakyTransport:
    """The jsonl transport behind a switch: while `down`, every publish fails like an unreachable bus."""

    name = "flaky"
    commands = None

    def __init__(self, inner: JsonlTransport) -> None:
        self.inner = inner
        self.down = threading.Event()
        self.refused = 0

    def publish(self, message: OutboundMessage) -> None:
        if self.down.is_set():
            self.refused += 1
            raise TransportUnavailableError("bus unreachable (test switch)")
        self.inner.publish(message)

    def check(self) -> str:
        return "flaky"

    def rest(self) -> None:
        self.inner.rest()

    def close(self) -> None:
        self.inner.close()


def test_bus_down_for_a_while_then_back_delivers_everything_in_order(
    tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    # GIVEN an agent whose bus goes down
    with Simulator(cloud="azure", vm_names=["vm-0"]) as sim:
        settings = settings_for("azure", sim.base_urls[0], "vm-0", tmp_path)
        transport = FlakyTransport(JsonlTransport(settings.jsonl_path))
        transport.down.set()
        agent = agent_thread(settings, transport)

        # WHEN three events go through their whole lifecycle during the outage
        for event_id in ("E1", "E2", "E3"):
            control(sim, "events", {**EVENT, "event_id": event_id})
        wait_until(lambda: transport.refused >= 2, 20, "publishing to fail")
        for _ in range(2):
            for event_id in ("E1", "E2", "E3"):
                requests.post(f"{sim.base_urls[0]}/_sim/events/{event_id}/advance", timeout=5)
            threading.Event().wait(1.0)
        assert agent.envelopes() == []

        # AND the bus comes back
        transport.down.clear()
        envelopes = agent.wait_for_count(9, timeout=60)

    # THEN all nine envelopes arrive, each event in lifecycle order, none lost or doubled
    assert len(envelopes) == 9
    for event_id in ("E1", "E2", "E3"):
        assert [e["data"]["status"] for e in envelopes if e["data"]["event_id"] == event_id] == [
            "scheduled",
            "started",
            "completed",
        ]
    assert len({e["id"] for e in envelopes}) == 9


def test_a_slow_first_call_is_waited_for_not_counted_as_a_failure(
    tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    # GIVEN IMDS whose first Scheduled Events answer takes 3 s (the docs: up to two minutes)
    with Simulator(cloud="azure", vm_names=["vm-0"]) as sim:
        control(sim, "faults", {"first_call_delay": 3})
        control(sim, "events", EVENT)

        # WHEN the agent starts
        agent = agent_thread(settings_for("azure", sim.base_urls[0], "vm-0", tmp_path))
        envelopes = agent.wait_for_count(1, timeout=20)
        traffic = sim.traffic()["vm-0"]

    # THEN the event was reported from that first answer, with no failed request before it
    assert [e["data"]["status"] for e in envelopes] == ["scheduled"]
    assert set(traffic["by_status"]) == {"200"}


def test_gce_gets_the_60_second_warning_for_every_migration(
    tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    # GIVEN the agent watching GCE, and a simulator that skips the warning for VMs that did not
    # query maintenance-event directly since the last event (as GCE does)
    with Simulator(cloud="gce", vm_names=["gce-vm-0"]) as sim:
        agent = agent_thread(settings_for("gce", sim.base_urls[0], "gce-vm-0", tmp_path))
        wait_until(lambda: sim.traffic()["gce-vm-0"]["total"] >= 3, 10, "the agent's first reads")

        # WHEN three live migrations follow one another
        for _ in range(3):
            for value in ("MIGRATE_ON_HOST_MAINTENANCE", "NONE"):
                control(sim, "gce", {"key": "maintenance-event", "value": value})
                threading.Event().wait(0.5)
        envelopes = agent.wait_for_count(6, timeout=20)
        skipped = [e for e in sim.log_entries() if str(e["message"]).startswith("warning skipped")]

    # THEN every warning was shown and reported: scheduled and completed, three times
    assert skipped == []
    assert [e["data"]["status"] for e in envelopes] == ["scheduled", "completed"] * 3
    assert len({e["data"]["event_id"] for e in envelopes}) == 3
