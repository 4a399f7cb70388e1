"""Scripted maintenance timelines: the built-ins and the loader for scenario files.

A scenario is `{"cloud": ..., "vms": [...], "steps": [{"at": <documented s>, <one action>}, ...]}`.
Actions are the control API's bodies: `add` (POST /_sim/events), `approve` (as if a VM POSTed
StartRequests), `advance` and `cancel` (an EventId), `gce` (POST /_sim/gce) and `fault`
(POST /_sim/faults). "$N" in a VM name means the simulator's N-th VM. The built-ins are written
in the same format and go through the same validation as files.

The modules: the validated model, the built-ins, parsing and fitting, loading, running. The names
the simulator, its CLI and the tests use are exported here.
"""

from __future__ import annotations

from simulator.scenarios.built_in import LIVE_MIGRATION_EVENT_ID, SCENARIO_NAMES, describe_scenarios
from simulator.scenarios.loading import load_scenario
from simulator.scenarios.model import Scenario, ScenarioError, Step, StepAction
from simulator.scenarios.parsing import check_fits, parse_scenario
from simulator.scenarios.running import schedule

__all__ = [
    "LIVE_MIGRATION_EVENT_ID",
    "SCENARIO_NAMES",
    "Scenario",
    "ScenarioError",
    "Step",
    "StepAction",
    "check_fits",
    "describe_scenarios",
    "load_scenario",
    "parse_scenario",
    "schedule",
]
