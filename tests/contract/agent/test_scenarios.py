"""Every documented scenario, watched by the real agent over HTTP, yields exactly the expected
envelopes: the status sequence, one id per (event, status), nothing extra."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.config import AgentSettings
from simulator import Simulator, load_scenario
from tests.agent_runner import AgentThread, play_to_the_end, settings_for

# scenario → (reporter, expected (kind, status) sequence)
EXPECTED = {
    "azure-live-migration": ("WestNO_0", [("freeze", "scheduled"), ("freeze", "started"), ("freeze", "completed")]),
    "azure-user-reboot": (None, [("reboot", "scheduled"), ("reboot", "started"), ("reboot", "completed")]),
    "azure-redeploy": (None, [("redeploy", "scheduled"), ("redeploy", "started"), ("redeploy", "completed")]),
    # A Preempted or Terminated VM is deleted: its agent sees nothing after Started.
    "azure-preempt": (None, [("preempt", "scheduled"), ("preempt", "started")]),
    "azure-vmss-terminate": (None, [("terminate", "scheduled"), ("terminate", "started")]),
    "azure-canceled": (None, [("redeploy", "scheduled"), ("redeploy", "canceled")]),
    "azure-hardware-failure": (None, [("reboot", "started"), ("reboot", "completed")]),
    "gce-live-migrate": (None, [("live_migrate", "scheduled"), ("live_migrate", "completed")]),
    "gce-host-terminate": (None, [("host_terminate", "scheduled"), ("host_terminate", "completed")]),
    "gce-preempt": (None, [("preempt", "started")]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.slow
def test_scenario_yields_exactly_the_documented_envelopes(
    name: str, tmp_path: Path, agent_thread: Callable[[AgentSettings], AgentThread]
) -> None:
    reporter, expected = EXPECTED[name]
    scenario = load_scenario(name)
    with Simulator(scenario=scenario) as sim:
        vm = reporter or sim.vm_names[0]
        url = sim.base_urls[sim.vm_names.index(vm)]
        # GIVEN the agent watching the scenario's first VM
        agent = agent_thread(settings_for(scenario.cloud, url, vm, tmp_path))

        # WHEN the scenario plays to its end
        play_to_the_end(sim)
        agent.wait_for_count(len(expected), timeout=10)
        agent.halt()

    # THEN the envelopes are exactly the expected sequence, for one event, with stable ids
    envelopes = agent.envelopes()
    assert [(e["data"]["kind"], e["data"]["status"]) for e in envelopes] == expected
    assert len({e["data"]["event_id"] for e in envelopes}) == 1
    for envelope in envelopes:
        data = envelope["data"]
        key_id = data["event_id"].lower() if data["cloud"] == "azure" else data["event_id"]
        assert envelope["id"] == hashlib.sha256(f"{data['cloud']}|{key_id}|{data['status']}".encode()).hexdigest()
        assert envelope["source"] == f"/{data['cloud']}/{vm}"


@pytest.mark.slow
def test_gce_upcoming_maintenance_and_the_migration_it_announces(
    tmp_path: Path, agent_thread: Callable[[AgentSettings], AgentThread]
) -> None:
    # GIVEN the agent on a VM that gets an upcoming-maintenance notice, then the migration itself
    with Simulator(scenario=load_scenario("gce-upcoming")) as sim:
        agent = agent_thread(settings_for("gce", sim.base_urls[0], sim.vm_names[0], tmp_path))
        play_to_the_end(sim)
        agent.wait_for_count(5, timeout=10)
        agent.halt()

    # THEN the notice goes scheduled → started → completed, and the migration is its own event
    by_kind: dict[str, list[str]] = {}
    for kind, status, _ in agent.statuses():
        by_kind.setdefault(kind, []).append(status)
    assert by_kind == {
        "upcoming": ["scheduled", "started", "completed"],
        "live_migrate": ["scheduled", "completed"],
    }
