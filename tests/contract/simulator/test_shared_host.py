"""One host node shared by several VMs: an event added with `approval: all` starts only once every VM
in its Resources approved it, or at NotBefore ("If the VM is on shared infrastructure, the system will
then wait for all other tenants on the same hardware to also approve the job or timeout")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from simulator import ScenarioError, load_scenario
from tests.contract.simulator.conftest import StartSim, VmClient, clients
from tests.contract.simulator.test_azure_lifecycle import statuses
from tests.contract.simulator.test_scenarios import write

EVENT_ID = "4F1C2B3A-5D6E-4F70-8192-A3B4C5D6E7F8"


def outcomes(vm: VmClient) -> list[tuple[str, str]]:
    return [(a["vm"], a["outcome"]) for a in vm.get_list("approvals")]


def sim_view(vm: VmClient) -> dict[str, Any]:
    view: dict[str, Any] = vm.get_list("events")[0]["sim"]
    return view


@pytest.fixture
def host(start_sim: StartSim) -> list[VmClient]:
    """GIVEN two VMs on one host node, and a third VM of their availability set on another host."""
    return clients(start_sim(cloud="azure", vm_names=["node-a", "node-b", "elsewhere"]))


def test_an_all_approval_event_starts_only_once_every_vm_in_resources_approved(host: list[VmClient]) -> None:
    node_a, node_b, _ = host
    # GIVEN a Reboot of both VMs of the host, which needs every one's approval
    event = node_a.add_event(event_type="Reboot", event_id=EVENT_ID, resources=["$0", "$1"], approval="all")
    assert event["sim"]["approval"] == "all"
    # WHEN the first VM approves (twice), and the few seconds an approval takes pass
    first = node_a.approve(EVENT_ID)
    again = node_a.approve(EVENT_ID)
    node_a.advance(10)
    # THEN both answers are 200, yet the event waits for the other tenant
    assert (first.status_code, again.status_code) == (200, 200)
    assert statuses(node_b.events()) == [(EVENT_ID, "Scheduled")]
    assert sim_view(node_a)["approvals_from"] == ["node-a"]
    # WHEN the second VM approves too
    assert node_b.approve(EVENT_ID).status_code == 200
    node_b.advance(3)
    # THEN the event starts for both
    assert statuses(node_a.events()) == statuses(node_b.events()) == [(EVENT_ID, "Started")]
    assert outcomes(node_a) == [
        ("node-a", "waiting-for-others"),
        ("node-a", "already-approved"),
        ("node-b", "accepted"),
    ]
    assert sim_view(node_a)["approved_by"] == "node-b"


def test_an_all_approval_event_starts_at_not_before_when_a_tenant_never_approves(host: list[VmClient]) -> None:
    node_a, node_b, _ = host
    # GIVEN a Freeze of both VMs of the host that needs every one's approval, approved by one only
    node_a.add_event(event_type="Freeze", event_id=EVENT_ID, resources=["$0", "$1"], approval="all")
    node_a.approve(EVENT_ID)
    # WHEN its 15 minutes of notice run out
    node_a.advance(899)
    before = statuses(node_b.events())
    node_a.advance(1)
    # THEN it was Scheduled until NotBefore, and starts then (the timeout)
    assert before == [(EVENT_ID, "Scheduled")]
    assert statuses(node_b.events()) == [(EVENT_ID, "Started")]
    assert any(e["message"] == f"event {EVENT_ID} Started (NotBefore reached)" for e in node_a.get_list("log"))


def test_an_approval_from_a_vm_not_in_resources_does_not_count(host: list[VmClient]) -> None:
    node_a, node_b, elsewhere = host
    # GIVEN an event of the host's two VMs that needs every one's approval, seen by the whole set
    node_a.add_event(event_type="Redeploy", event_id=EVENT_ID, resources=["$0", "$1"], approval="all")
    # WHEN the VM on another host approves it, then the first tenant
    assert elsewhere.approve(EVENT_ID).status_code == 200
    node_a.approve(EVENT_ID)
    node_a.advance(10)
    # THEN the event still waits: the other host's VM is not a tenant of this one
    assert statuses(elsewhere.events()) == [(EVENT_ID, "Scheduled")]
    assert outcomes(node_a) == [("elsewhere", "not-in-resources"), ("node-a", "waiting-for-others")]
    # WHEN the second tenant approves, it starts
    node_b.approve(EVENT_ID)
    node_b.advance(3)
    assert statuses(elsewhere.events()) == [(EVENT_ID, "Started")]


def test_by_default_one_approval_starts_an_event_of_several_vms(host: list[VmClient]) -> None:
    node_a, node_b, _ = host
    # GIVEN a Reboot of both VMs of the host, added without `approval`
    event = node_a.add_event(event_type="Reboot", event_id=EVENT_ID, resources=["$0", "$1"])
    # WHEN one of them approves
    node_b.approve(EVENT_ID)
    node_b.advance(3)
    # THEN that one approval started it for both, as before
    assert event["sim"]["approval"] == "any"
    assert statuses(node_a.events()) == [(EVENT_ID, "Started")]
    assert outcomes(node_a) == [("node-b", "accepted")]


def test_a_scenario_marks_an_event_all_approval(tmp_path: Path, start_sim: StartSim) -> None:
    # GIVEN a scenario file whose event needs both VMs' approval, approved by both at 100 and 200
    path = write(
        tmp_path,
        "shared-host.json",
        {
            "cloud": "azure",
            "vms": ["node-a", "node-b"],
            "steps": [
                {"at": 60, "add": {"event_type": "Reboot", "event_id": EVENT_ID, "resources": ["$0", "$1"],
                                   "approval": "all"}},
                {"at": 100, "approve": {"event_id": EVENT_ID, "vm": "$0"}},
                {"at": 200, "approve": {"event_id": EVENT_ID, "vm": "$1"}},
            ],
        },
    )  # fmt: skip
    node_a = clients(start_sim(scenario=path))[0]
    # WHEN the timeline passes the first approval, then the second one and nearly the 3 s it takes
    node_a.advance(150)
    after_the_first = statuses(node_a.events())
    node_a.advance(52)
    after_the_second = statuses(node_a.events())
    node_a.advance(1)
    # THEN the event waited for the second approval, and started 3 documented s after it
    assert after_the_first == after_the_second == [(EVENT_ID, "Scheduled")]
    assert statuses(node_a.events()) == [(EVENT_ID, "Started")]


def test_approval_must_be_any_or_all(tmp_path: Path, azure: VmClient) -> None:
    # WHEN an event is added with an unknown approval rule, through the control API or a scenario
    refused = azure.control("POST", "events", {"event_type": "Reboot", "approval": "most"})
    step = {"at": 1, "add": {"event_type": "Reboot", "approval": "most"}}
    path = write(tmp_path, "bad.json", {"cloud": "azure", "steps": [step]})
    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    # THEN both name the field and the choices
    assert refused.status_code == 400
    assert "field 'approval': must be one of any, all" in refused.json()["error"]
    assert "step 0: field 'add.approval': must be one of any, all" in str(error.value)
