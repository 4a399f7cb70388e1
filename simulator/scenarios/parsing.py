"""Validation of a scenario document, strict: every error names the step index and the field.

`check_fits` then refuses a scenario whose cloud or VM references the running simulator cannot serve.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.control import resolve_name, resolve_vm
from simulator.faults import parse_fault_change
from simulator.gce_api import parse_gce_change
from simulator.scenarios.model import Scenario, ScenarioError, Step, StepAction
from simulator.store import Cloud, FieldError, parse_event_spec

_AZURE_ONLY = {StepAction.ADD, StepAction.APPROVE, StepAction.ADVANCE, StepAction.CANCEL}


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
        step = _parse_action(float(at), action, body)
    except FieldError as exc:
        raise ScenarioError(f"{prefix}: field '{action.value}.{exc.field}': {exc.reason}") from None
    return step


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
