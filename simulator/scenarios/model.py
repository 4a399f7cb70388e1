"""A scenario as the simulator holds it once validated: its steps and their actions.

Pure data shared by the parser, the built-ins' loader and the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from simulator.faults import FaultChange
from simulator.gce_api import GceChange
from simulator.store import Cloud, EventSpec


class ScenarioError(ValueError):
    """A scenario that cannot be loaded or does not fit the simulator; the message says what to fix."""


class StepAction(str, Enum):
    ADD = "add"
    APPROVE = "approve"
    ADVANCE = "advance"
    CANCEL = "cancel"
    GCE = "gce"
    FAULT = "fault"


@dataclass(frozen=True)
class Step:
    """One validated step; exactly the field of its action is set."""

    at: float
    action: StepAction
    add: EventSpec | None = None
    event_id: str | None = None  # approve, advance, cancel
    vm: str = "$0"  # approve: the VM that POSTs
    gce: GceChange | None = None
    fault: FaultChange | None = None

    def describe(self) -> str:
        if self.add is not None:
            return f"add {self.add.event_type.value}"
        if self.gce is not None:
            return f"gce {self.gce.key.value}"
        if self.fault is not None:
            return "fault"
        return f"{self.action.value} {self.event_id}"


@dataclass(frozen=True)
class Scenario:
    name: str
    cloud: Cloud
    vms: tuple[str, ...]
    steps: tuple[Step, ...]
    description: str = ""
