"""Scripted maintenance timelines: the built-ins and the loader for scenario files.

A scenario is `{"cloud": ..., "vms": [...], "steps": [{"at": <documented s>, <one action>}, ...]}`.
Actions are the control API's bodies: `add` (POST /_sim/events), `approve` (as if a VM POSTed
StartRequests), `advance` and `cancel` (an EventId), `gce` (POST /_sim/gce) and `fault`
(POST /_sim/faults). "$N" in a VM name means the simulator's N-th VM. The built-ins below are written
in the same format and go through the same validation as files.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from simulator.control import Actions, resolve_name, resolve_vm
from simulator.faults import FaultChange, parse_fault_change
from simulator.gce_api import GceChange, parse_gce_change
from simulator.store import Cloud, EventSpec, FieldError, RequestError, SimLog, Timeline, parse_event_spec


class ScenarioError(ValueError):
    """A scenario that cannot be loaded or does not fit the simulator; the message says what to fix."""


class StepAction(str, Enum):
    ADD = "add"
    APPROVE = "approve"
    ADVANCE = "advance"
    CANCEL = "cancel"
    GCE = "gce"
    FAULT = "fault"


_AZURE_ONLY = {StepAction.ADD, StepAction.APPROVE, StepAction.ADVANCE, StepAction.CANCEL}


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


# --------------------------------------------------------------------------- built-ins

LIVE_MIGRATION_EVENT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"  # the documented example's EventId

_BUILTINS: dict[str, dict[str, object]] = {
    "azure-live-migration": {
        "description": "The documented example: a memory-preserving live migration freezes WestNO_0 and "
        "WestNO_1 for 5 s (incarnations 1 empty, 2 Scheduled, 3 Started, 4 empty).",
        "cloud": "azure",
        "vms": ["WestNO_0", "WestNO_1"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Freeze",
                    "event_id": LIVE_MIGRATION_EVENT_ID,
                    "resources": ["$0", "$1"],
                    "event_source": "Platform",
                    "duration_seconds": 5,
                    "description": "Virtual machine is being paused because of a memory-preserving "
                    "Live Migration operation.",
                },
            }
        ],
    },
    "azure-user-reboot": {
        "description": "A user restarts the VM from the portal: Reboot with EventSource User, 15 min notice.",
        "cloud": "azure",
        "vms": ["vm-0"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Reboot",
                    "event_id": "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7",
                    "resources": ["$0"],
                    "event_source": "User",
                    "description": "Virtual machine is going to be restarted as requested by authorized user.",
                },
            }
        ],
    },
    "azure-redeploy": {
        "description": "Platform maintenance moves the VM to another host: Redeploy, 10 min notice.",
        "cloud": "azure",
        "vms": ["vm-0"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Redeploy",
                    "event_id": "F020BA2E-3BC0-4C40-A10B-86575A9EABD5",
                    "resources": ["$0"],
                    "event_source": "Platform",
                    "description": "Host server is undergoing maintenance.",
                },
            }
        ],
    },
    "azure-preempt": {
        "description": "A Spot VM is evicted: Preempt with 30 s notice; the VM is deleted once it started.",
        "cloud": "azure",
        "vms": ["spot-vm-0"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Preempt",
                    "event_id": "602D9444-D2CD-49C7-8624-8643E7171297",
                    "resources": ["$0"],
                    "event_source": "Platform",
                },
            }
        ],
    },
    "azure-vmss-terminate": {
        "description": "A scale-in deletes one scale set instance: Terminate (notBeforeTimeout 10 min) "
        "for that instance only, seen by every instance of the placement group; that instance is deleted once "
        "it started, the others see the event removed.",
        "cloud": "azure",
        "vms": ["myScaleSet_0", "myScaleSet_1"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Terminate",
                    "event_id": "3A5B8C2D-6E7F-4A1B-9C0D-1E2F3A4B5C6D",
                    "resources": ["$0"],
                    "event_source": "User",
                    "notice": 600,
                },
            }
        ],
    },
    "azure-canceled": {
        "description": "Azure judges a Redeploy too risky and cancels it while Scheduled (the event vanishes).",
        "cloud": "azure",
        "vms": ["vm-0"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Redeploy",
                    "event_id": "9B2E4F6A-1C3D-4E5F-8A7B-6C5D4E3F2A1B",
                    "resources": ["$0"],
                    "event_source": "Platform",
                },
            },
            {"at": 360, "cancel": "9B2E4F6A-1C3D-4E5F-8A7B-6C5D4E3F2A1B"},
        ],
    },
    "azure-hardware-failure": {
        "description": "The host fails: a Reboot appears already Started, with no notice and NotBefore blank.",
        "cloud": "azure",
        "vms": ["vm-0"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Reboot",
                    "event_id": "E4D3C2B1-A0F9-4E8D-B7C6-5A4B3C2D1E0F",
                    "resources": ["$0"],
                    "status": "Started",
                    "event_source": "Platform",
                    "description": "Virtual machine is being restarted because its host had a hardware failure.",
                },
            }
        ],
    },
    "gce-live-migrate": {
        "description": "maintenance-event MIGRATE_ON_HOST_MAINTENANCE 60 s before a live migration of "
        "about 10 s, then NONE.",
        "cloud": "gce",
        "vms": ["gce-vm-0"],
        "steps": [
            {"at": 60, "gce": {"vm": "$0", "key": "maintenance-event", "value": "MIGRATE_ON_HOST_MAINTENANCE"}},
            {"at": 130, "gce": {"vm": "$0", "key": "maintenance-event", "value": "NONE"}},
        ],
    },
    "gce-host-terminate": {
        "description": "A VM that cannot live-migrate (GPU): TERMINATE_ON_HOST_MAINTENANCE 60 min before "
        "the host maintenance, NONE about 60 s after it begins.",
        "cloud": "gce",
        "vms": ["gce-vm-0"],
        "steps": [
            {"at": 60, "gce": {"vm": "$0", "key": "maintenance-event", "value": "TERMINATE_ON_HOST_MAINTENANCE"}},
            {"at": 3720, "gce": {"vm": "$0", "key": "maintenance-event", "value": "NONE"}},
        ],
    },
    "gce-upcoming": {
        "description": "upcoming-maintenance announces a window 1 h ahead (PENDING, canReschedule); at the "
        "window start it turns ONGOING and a live migration follows, then both clear.",
        "cloud": "gce",
        "vms": ["gce-vm-0"],
        "steps": [
            {
                "at": 60,
                "gce": {
                    "vm": "$0",
                    "key": "upcoming-maintenance",
                    "value": {
                        "maintenanceType": "SCHEDULED",
                        "canReschedule": True,
                        "maintenanceStatus": "PENDING",
                        "window_start_in": 3600,
                        "window_length": 14400,
                    },
                },
            },
            {"at": 3660, "gce": {"vm": "$0", "key": "upcoming-maintenance", "value": {"maintenanceStatus": "ONGOING"}}},
            {"at": 3660, "gce": {"vm": "$0", "key": "maintenance-event", "value": "MIGRATE_ON_HOST_MAINTENANCE"}},
            {"at": 3730, "gce": {"vm": "$0", "key": "maintenance-event", "value": "NONE"}},
            {"at": 3730, "gce": {"vm": "$0", "key": "upcoming-maintenance", "value": None}},
        ],
    },
    "gce-preempt": {
        "description": "A Spot / preemptible VM is preempted: preempted turns TRUE, and the VM shuts down 30 s later.",
        "cloud": "gce",
        "vms": ["gce-spot-0"],
        "steps": [{"at": 60, "gce": {"vm": "$0", "key": "preempted", "value": "TRUE"}}],
    },
}

SCENARIO_NAMES: tuple[str, ...] = tuple(_BUILTINS)


# --------------------------------------------------------------------------- loading and validation


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario file (.json, .yaml or .yml)."""
    if name_or_path in _BUILTINS:
        return parse_scenario(_BUILTINS[name_or_path], name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise ScenarioError(
            f"unknown scenario {name_or_path!r}: use a built-in one ({', '.join(SCENARIO_NAMES)}) "
            f"or the path of a .json/.yaml scenario file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"scenario file {path}: cannot read it: {exc}") from None
    suffix = path.suffix.lower()
    if suffix in {".yaml", ".yml"}:
        data = _load_yaml(path, text)
    elif suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ScenarioError(f"scenario file {path}: not valid JSON: {exc}") from None
    else:
        raise ScenarioError(f"scenario file {path}: name it .json, .yaml or .yml so its format is known")
    return parse_scenario(data, str(path))


def _load_yaml(path: Path, text: str) -> object:
    # PyYAML is optional: only YAML scenario files need it.
    try:
        import yaml
    except ImportError:
        raise ScenarioError(
            f"scenario file {path} is YAML but PyYAML is not installed: install PyYAML (pip install pyyaml) "
            f"or use a JSON scenario file"
        ) from None
    try:
        loaded: object = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"scenario file {path}: not valid YAML: {exc}") from None
    return loaded


def parse_scenario(data: object, name: str) -> Scenario:
    """Validate a scenario document strictly; errors name the step index and the field."""
    where = f"scenario {name}"
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: must be an object with cloud, vms and steps")
    unknown = sorted(set(data) - {"cloud", "vms", "steps", "description"})
    if unknown:
        raise ScenarioError(f"{where}: unknown field {unknown[0]!r}; allowed: cloud, vms, steps, description")
    cloud_value = data.get("cloud")
    if cloud_value not in {c.value for c in Cloud}:
        raise ScenarioError(f"{where}: field 'cloud' must be 'azure' or 'gce', got {cloud_value!r}")
    cloud = Cloud(cloud_value)
    default_vm = "vm-0" if cloud is Cloud.AZURE else "gce-vm-0"
    vms = data.get("vms", [default_vm])
    if not isinstance(vms, list) or not vms or not all(isinstance(v, str) and v for v in vms):
        raise ScenarioError(f"{where}: field 'vms' must be a non-empty list of VM names")
    if len(set(vms)) != len(vms):
        raise ScenarioError(f"{where}: field 'vms' lists a VM name twice")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ScenarioError(f"{where}: field 'description' must be a string")
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise ScenarioError(f"{where}: field 'steps' must be a non-empty list of steps")
    steps = tuple(_parse_step(raw, index, cloud, where) for index, raw in enumerate(raw_steps))
    return Scenario(name=name, cloud=cloud, vms=tuple(vms), steps=steps, description=description)


def _parse_step(raw: object, index: int, cloud: Cloud, where: str) -> Step:
    prefix = f"{where}: step {index}"
    if not isinstance(raw, dict):
        raise ScenarioError(f"{prefix}: must be an object like {{'at': 60, 'add': {{...}}}}")
    at = raw.get("at")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or at < 0:
        raise ScenarioError(f"{prefix}: field 'at' is required: documented seconds >= 0")
    actions = [key for key in raw if key not in {"at", "comment"}]
    names = ", ".join(a.value for a in StepAction)
    if len(actions) != 1 or actions[0] not in {a.value for a in StepAction}:
        raise ScenarioError(f"{prefix}: needs exactly one action ({names}) besides 'at' and 'comment'; got {actions}")
    action = StepAction(actions[0])
    if action in _AZURE_ONLY and cloud is not Cloud.AZURE:
        raise ScenarioError(f"{prefix}: action '{action.value}' is for azure scenarios; this one is {cloud.value}")
    if action is StepAction.GCE and cloud is not Cloud.GCE:
        raise ScenarioError(f"{prefix}: action 'gce' is for gce scenarios; this one is {cloud.value}")
    body = raw[action.value]
    try:
        return _parse_action(float(at), action, body)
    except FieldError as exc:
        raise ScenarioError(f"{prefix}: field '{action.value}.{exc.field}': {exc.reason}") from None


def _parse_action(at: float, action: StepAction, body: object) -> Step:
    if action in {StepAction.ADVANCE, StepAction.CANCEL}:
        if not isinstance(body, str) or not body:
            raise FieldError("(value)", "must be the EventId to act on")
        return Step(at=at, action=action, event_id=body)
    if action is StepAction.APPROVE:
        if isinstance(body, str) and body:
            return Step(at=at, action=action, event_id=body)
        if not isinstance(body, dict) or set(body) - {"event_id", "vm"}:
            raise FieldError("(value)", 'must be an EventId or {"event_id": ..., "vm": "$0"}')
        event_id, vm = body.get("event_id"), body.get("vm", "$0")
        if not isinstance(event_id, str) or not event_id:
            raise FieldError("event_id", "is required: the EventId to approve")
        if not isinstance(vm, str) or not vm:
            raise FieldError("vm", "must be the name (or '$N') of the VM that approves")
        return Step(at=at, action=action, event_id=event_id, vm=vm)
    if not isinstance(body, dict):
        raise FieldError("(value)", "must be an object")
    if action is StepAction.ADD:
        return Step(at=at, action=action, add=parse_event_spec(body))
    if action is StepAction.GCE:
        return Step(at=at, action=action, gce=parse_gce_change(body))
    return Step(at=at, action=action, fault=parse_fault_change(body))


def check_fits(scenario: Scenario, cloud: Cloud, vm_names: Sequence[str]) -> None:
    """Refuse a scenario whose cloud or VM references this simulator cannot serve."""
    if scenario.cloud is not cloud:
        raise ScenarioError(
            f"scenario {scenario.name} is for {scenario.cloud.value} but the simulator serves {cloud.value}; "
            f"drop --cloud or pass --cloud {scenario.cloud.value}"
        )
    for index, step in enumerate(scenario.steps):
        try:
            for ref in _vm_references(step):
                resolve_vm(ref[1], vm_names, ref[0])
            resources = step.add.resources if step.add is not None and step.add.resources else ()
            for resource in resources:
                resolve_name(resource, vm_names, scenario.vms, "resources")
        except FieldError as exc:
            raise ScenarioError(
                f"scenario {scenario.name}: step {index}: field '{step.action.value}.{exc.field}': {exc.reason}"
            ) from None


def _vm_references(step: Step) -> list[tuple[str, str]]:
    if step.add is not None:
        return [("audience", name) for name in step.add.audience or ()]
    if step.action is StepAction.APPROVE:
        return [("vm", step.vm)]
    vm = step.gce.vm if step.gce is not None else step.fault.vm if step.fault is not None else None
    return [] if vm is None else [("vm", vm)]


# --------------------------------------------------------------------------- running


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


def describe_scenarios() -> Mapping[str, str]:
    """Name -> one-line description of every built-in scenario (for --help and errors)."""
    return {name: str(body.get("description", "")) for name, body in _BUILTINS.items()}
