"""Running a scenario: every step on the simulator's timeline, applied through the control API's actions.

A step that no longer applies is logged, and the rest of the timeline still runs.
"""

from __future__ import annotations

import functools

from simulator.control import Actions
from simulator.scenarios.model import Scenario, Step, StepAction
from simulator.store import RequestError, SimLog, Timeline


def schedule(scenario: Scenario, actions: Actions, timeline: Timeline, log: SimLog, origin_vm: str) -> None:
    """Put every step on the timeline; steps with the same `at` run in file order."""
    for index, step in enumerate(scenario.steps):
        timeline.schedule(
            f"step:{index}",
            step.at,
            f"step {index}: {step.describe()}",
            functools.partial(_run_step, step, index, actions, log, origin_vm),
        )


def _run_step(step: Step, index: int, actions: Actions, log: SimLog, origin_vm: str, at: float) -> None:
    try:
        if step.add is not None:
            actions.add_event(step.add, origin_vm, at=at)
        elif step.gce is not None:
            actions.set_gce(step.gce, origin_vm, at=at)
        elif step.fault is not None:
            actions.set_faults(step.fault, at=at)
        elif step.action is StepAction.APPROVE:
            assert step.event_id is not None
            actions.approve(actions.resolve_vm(step.vm, "vm"), [step.event_id], at=at)
        elif step.action is StepAction.ADVANCE:
            assert step.event_id is not None
            actions.advance_event(step.event_id, at=at)
        else:
            assert step.event_id is not None
            actions.cancel_event(step.event_id, at=at)
    except RequestError as exc:
        # A step that no longer applies (say, cancel after an approval started the event) is logged,
        # not fatal: the rest of the timeline still runs.
        log.add(f"step {index} ({step.describe()}) not applied: {exc.message}", at=at)
