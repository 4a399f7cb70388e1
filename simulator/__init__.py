"""A local metadata service for rehearsing maintenance: Azure IMDS Scheduled Events and GCE metadata.

    from simulator import Simulator, load_scenario

    with Simulator(scenario=load_scenario("azure-live-migration"), speed=60) as sim:
        print(sim.base_urls)  # one URL per VM; the control API is under <url>/_sim/

See docs/simulator.md for the endpoints, the control API, scenario files and faults.
"""

from __future__ import annotations

from simulator.scenarios import SCENARIO_NAMES, Scenario, ScenarioError, load_scenario
from simulator.server import Simulator

__all__ = ["SCENARIO_NAMES", "Scenario", "ScenarioError", "Simulator", "load_scenario"]
