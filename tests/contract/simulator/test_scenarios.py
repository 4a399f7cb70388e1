"""Scenarios: every built-in runs to its end under clock advance; example files load and run; bad files fail clearly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import requests

from simulator import SCENARIO_NAMES, ScenarioError, Simulator, load_scenario
from tests.contract.simulator.conftest import StartSim, VmClient, clients

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "scenarios"

Observation = Any
UNREACHABLE = "unreachable"


def reachable(view: Callable[[], Observation]) -> Callable[[], Observation]:
    """`view`, or UNREACHABLE once the VM's port refuses connections (a deleted or preempted VM)."""

    def observe() -> Observation:
        try:
            return view()
        except requests.ConnectionError:
            return UNREACHABLE

    return observe


def azure_view(vm: VmClient) -> Observation:
    document = vm.events()
    return [(e["EventType"], e["EventStatus"]) for e in document["Events"]]


def gce_view(vm: VmClient) -> Observation:
    """maintenance-event (queried directly, so the warning is never skipped), upcoming status, preempted."""

    def read(path: str) -> tuple[int, str]:
        for _ in range(5):  # the docs' client retries 503 during maintenance; so does this one
            response = vm.gce(path)
            if response.status_code != 503:
                return response.status_code, response.text
        raise AssertionError(f"{path} kept answering 503")

    event = read("instance/maintenance-event")[1]
    status, text = read("instance/upcoming-maintenance")
    upcoming = json.loads(text)["maintenanceStatus"] if status == 200 else None
    return (event, upcoming, read("instance/preempted")[1])


def run_to_end(
    driver: VmClient, views: dict[str, Callable[[], Observation]], limit: int = 40
) -> dict[str, list[tuple[float, Observation]]]:
    """Advance the clock to each timeline entry until none is left; record every change of each view.

    Returns, per view, the (documented time, observation) of the start and of each change.
    """
    seen: dict[str, list[tuple[float, Observation]]] = {name: [(0.0, view())] for name, view in views.items()}
    for _ in range(limit):
        state = driver.state()
        if not state["timeline"]:
            return seen
        due = state["timeline"][0]["at"]
        driver.advance(max(0.0, due - state["clock"]["sim_time"]) + 0.001)
        for name, view in views.items():
            observation = view()
            if observation != seen[name][-1][1]:
                seen[name].append((due, observation))
    raise AssertionError(f"the timeline did not end after {limit} steps")


AZURE_EXPECTED: dict[str, list[tuple[float, Observation]]] = {
    "azure-live-migration": [(0, []), (60, [("Freeze", "Scheduled")]), (960, [("Freeze", "Started")]), (1560, [])],
    "azure-user-reboot": [(0, []), (60, [("Reboot", "Scheduled")]), (960, [("Reboot", "Started")]), (1560, [])],
    "azure-redeploy": [(0, []), (60, [("Redeploy", "Scheduled")]), (660, [("Redeploy", "Started")]), (1260, [])],
    "azure-preempt": [(0, []), (60, [("Preempt", "Scheduled")]), (90, [("Preempt", "Started")]), (690, [])],
    "azure-vmss-terminate": [
        (0, []),
        (60, [("Terminate", "Scheduled")]),
        (660, [("Terminate", "Started")]),
        (1260, []),
    ],
    "azure-canceled": [(0, []), (60, [("Redeploy", "Scheduled")]), (360, [])],
    "azure-hardware-failure": [(0, []), (60, [("Reboot", "Started")]), (660, [])],
}
GCE_EXPECTED: dict[str, list[tuple[float, Observation]]] = {
    "gce-live-migrate": [
        (0, ("NONE", None, "FALSE")),
        (60, ("MIGRATE_ON_HOST_MAINTENANCE", None, "FALSE")),
        (130, ("NONE", None, "FALSE")),
    ],
    "gce-host-terminate": [
        (0, ("NONE", None, "FALSE")),
        (60, ("TERMINATE_ON_HOST_MAINTENANCE", None, "FALSE")),
        (3720, ("NONE", None, "FALSE")),
    ],
    "gce-upcoming": [
        (0, ("NONE", None, "FALSE")),
        (60, ("NONE", "PENDING", "FALSE")),
        (3660, ("MIGRATE_ON_HOST_MAINTENANCE", "ONGOING", "FALSE")),
        (3730, ("NONE", None, "FALSE")),
    ],
    "gce-preempt": [(0, ("NONE", None, "FALSE")), (60, ("NONE", None, "TRUE")), (90, UNREACHABLE)],
}
# The Azure built-ins whose event deletes their first VM, and when its port closes: two documented
# seconds (at speed 1, two real ones) after the event started. The other VMs see the whole sequence.
FIRST_VM_DELETED_AT = {"azure-preempt": 92, "azure-vmss-terminate": 662}


def seen_by_the_first_vm(name: str) -> list[tuple[float, Observation]]:
    deleted_at = FIRST_VM_DELETED_AT.get(name)
    if deleted_at is None:
        return AZURE_EXPECTED[name]
    return [(at, seen) for at, seen in AZURE_EXPECTED[name] if at < deleted_at] + [(deleted_at, UNREACHABLE)]


def with_an_observer(start_sim: StartSim, name: str) -> tuple[VmClient, VmClient]:
    """The built-in on its own VMs plus one more that no event deletes: (its first VM, the observer)."""
    sim = start_sim(scenario=name, vm_names=[*load_scenario(name).vms, "observer"])
    return clients(sim)[0], clients(sim)[-1]


def test_every_built_in_scenario_has_an_expected_sequence() -> None:
    # GIVEN the built-in names
    # THEN the lists below cover every one of them, so no built-in goes untested
    assert len(SCENARIO_NAMES) == 11
    assert set(SCENARIO_NAMES) == set(AZURE_EXPECTED) | set(GCE_EXPECTED)


@pytest.mark.parametrize("name", sorted(AZURE_EXPECTED))
def test_azure_built_in_runs_to_its_end(start_sim: StartSim, name: str) -> None:
    # GIVEN a built-in Azure scenario on its default VMs, plus an observer VM of the same set
    first, observer = with_an_observer(start_sim, name)
    # WHEN the clock is advanced from one timeline entry to the next until the scenario is over
    views = {"first": reachable(lambda: azure_view(first)), "observer": lambda: azure_view(observer)}
    seen = run_to_end(observer, views)
    # THEN the VMs saw the documented status sequence at the documented times; a deleted one until it went
    assert seen["observer"] == AZURE_EXPECTED[name]
    assert seen["first"] == seen_by_the_first_vm(name)
    # THEN each change was exactly one DocumentIncarnation, and the last state keeps being served
    assert observer.events()["DocumentIncarnation"] == len(seen["observer"])
    observer.advance(3600)
    assert observer.events()["DocumentIncarnation"] == len(seen["observer"])
    assert observer.state()["scenario"] == {"name": name, "steps_pending": 0}


@pytest.mark.parametrize("name", sorted(GCE_EXPECTED))
def test_gce_built_in_runs_to_its_end(start_sim: StartSim, name: str) -> None:
    # GIVEN a built-in GCE scenario, plus an observer VM to drive it (a preempted VM shuts down)
    vm, observer = with_an_observer(start_sim, name)
    # WHEN the clock is advanced from one timeline entry to the next (the client watches maintenance-event)
    seen = run_to_end(observer, {"vm": reachable(lambda: gce_view(vm))})["vm"]
    # THEN the values changed as documented, and no warning was skipped
    assert seen == GCE_EXPECTED[name]
    assert not [e for e in observer.get_list("log") if e["message"].startswith("warning skipped")]


def test_unwatched_vm_misses_the_live_migration_warning(start_sim: StartSim) -> None:
    # GIVEN the live-migration scenario and a client that never queries maintenance-event
    vm = clients(start_sim(scenario="gce-live-migrate"))[0]
    # WHEN the scenario runs to its end
    seen = run_to_end(vm, {"preempted": lambda: vm.gce("instance/preempted").text})
    # THEN the migration happened without the key ever leaving NONE, and the log says so
    assert seen == {"preempted": [(0.0, "FALSE")]}
    assert vm.gce("instance/maintenance-event").text == "NONE"
    assert any(e["message"].startswith("warning skipped") for e in vm.get_list("log"))


def test_live_migration_with_fewer_vms_uses_the_default_names(start_sim: StartSim) -> None:
    # GIVEN the live-migration scenario served for one VM only
    sim = start_sim(scenario="azure-live-migration", vm_names=["only-vm"])
    vm = clients(sim)[0]
    # WHEN the event appears
    vm.advance(60)
    # THEN "$0" is the VM given and "$1" falls back to the scenario's second name
    assert vm.events()["Events"][0]["Resources"] == ["only-vm", "WestNO_1"]


# --------------------------------------------------------------------------- example files


def test_custom_azure_example_runs(start_sim: StartSim) -> None:
    # GIVEN the example file with an availability set and a Spot VM
    sim = start_sim(scenario=str(EXAMPLES / "custom-azure.json"))
    web0, web1, spot = clients(sim)
    assert sim.vm_names == ["web-0", "web-1", "batch-spot"]
    # THEN its step at 0 armed the first-call delay before any request; disarm it to keep the test fast
    assert web0.state()["faults"]["web-0"]["first_call_delay"] == 20
    web0.post_ok("faults", {"first_call_delay": 0})
    # WHEN it runs to its end
    seen = run_to_end(
        web0,
        {
            "web-0": lambda: azure_view(web0),
            "batch-spot": reachable(lambda: azure_view(spot)),
            "web-1-status": lambda: web1.get_events().status_code,
        },
    )
    # THEN the set saw its Reboot approved at 360 and started 3 s later; the Spot VM only its eviction,
    # until it was deleted 2 s after the eviction started
    assert seen["web-0"] == [(0, []), (60, [("Reboot", "Scheduled")]), (363, [("Reboot", "Started")]), (963, [])]
    assert seen["batch-spot"] == [
        (0, []),
        (400, [("Preempt", "Scheduled")]),
        (430, [("Preempt", "Started")]),
        (432, UNREACHABLE),
    ]
    assert seen["web-1-status"][1] == (500, 503)
    approvals = sim.approvals()
    assert [(a["vm"], a["source"], a["outcome"]) for a in approvals] == [("web-0", "scenario", "accepted")]


def test_custom_gce_example_runs(start_sim: StartSim) -> None:
    # GIVEN the YAML example with a web VM and a Spot VM
    sim = start_sim(scenario=str(EXAMPLES / "custom-gce.yaml"))
    web, spot = clients(sim)
    # WHEN it runs to its end while both clients watch
    seen = run_to_end(web, {"web": lambda: gce_view(web), "spot": reachable(lambda: gce_view(spot))})
    # THEN the web VM got its window, the migration at the window start, then nothing; the Spot VM was
    # preempted, and shut down 30 s later
    assert seen["web"] == [
        (0, ("NONE", None, "FALSE")),
        (60, ("NONE", "PENDING", "FALSE")),
        (1860, ("MIGRATE_ON_HOST_MAINTENANCE", "ONGOING", "FALSE")),
        (1930, ("NONE", None, "FALSE")),
    ]
    assert seen["spot"] == [(0, ("NONE", None, "FALSE")), (600, ("NONE", None, "TRUE")), (630, UNREACHABLE)]


def test_example_files_parse_like_built_ins() -> None:
    # WHEN both examples are loaded
    azure, gce = load_scenario(str(EXAMPLES / "custom-azure.json")), load_scenario(str(EXAMPLES / "custom-gce.yaml"))
    # THEN they have their clouds, VMs and steps
    assert (azure.cloud.value, azure.vms, len(azure.steps)) == ("azure", ("web-0", "web-1", "batch-spot"), 5)
    assert (gce.cloud.value, gce.vms, len(gce.steps)) == ("gce", ("gce-web-0", "gce-spot-1"), 7)


# --------------------------------------------------------------------------- errors


def write(tmp_path: Path, name: str, content: object) -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"cloud": "azure", "steps": [{"add": {"event_type": "Reboot"}}]}, "step 0: field 'at'"),
        (
            {
                "cloud": "azure",
                "steps": [{"at": 1, "add": {"event_type": "Reboot"}}, {"at": 2, "add": {"event_type": "Nap"}}],
            },
            "step 1: field 'add.event_type': must be one of Freeze, Reboot, Redeploy, Preempt, Terminate",
        ),
        ({"cloud": "azure", "steps": [{"at": 1, "add": {"event_type": "Reboot", "notice": -5}}]}, "field 'add.notice'"),
        ({"cloud": "azure", "steps": [{"at": 1, "cancel": "X", "advance": "X"}]}, "step 0: needs exactly one action"),
        ({"cloud": "azure", "steps": [{"at": 1, "gce": {"key": "preempted", "value": True}}]}, "step 0: action 'gce'"),
        (
            {"cloud": "gce", "steps": [{"at": 1, "gce": {"key": "maintenance-event", "value": "SOON"}}]},
            "field 'gce.value'",
        ),
        ({"cloud": "gce", "steps": [{"at": 1, "fault": {"drop": "many"}}]}, "step 0: field 'fault.drop'"),
        ({"cloud": "aws", "steps": [{"at": 1, "fault": {"drop": 1}}]}, "field 'cloud'"),
        ({"cloud": "azure", "steps": [], "extra": 1}, "unknown field 'extra'"),
        ({"cloud": "azure", "steps": []}, "field 'steps' must be a non-empty list"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_scenario_files_fail_with_the_step_and_field(tmp_path: Path, content: object, message: str) -> None:
    # GIVEN a broken scenario file
    path = write(tmp_path, "broken.json", content)
    # WHEN it is loaded
    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    # THEN the error names what to fix
    assert message in str(error.value)
    assert "broken.json" in str(error.value)


def test_unknown_scenario_lists_the_built_ins() -> None:
    # WHEN an unknown name is asked for
    with pytest.raises(ScenarioError) as error:
        load_scenario("azure-meteor-strike")
    # THEN every built-in name is offered
    assert all(name in str(error.value) for name in SCENARIO_NAMES)


def test_unknown_file_extension_is_refused(tmp_path: Path) -> None:
    # WHEN a scenario file has no known extension
    path = write(tmp_path, "scenario.txt", {"cloud": "azure", "steps": [{"at": 1, "fault": {"drop": 1}}]})
    # THEN the loader asks for .json or .yaml
    with pytest.raises(ScenarioError, match=r"\.json, \.yaml or \.yml"):
        load_scenario(path)


def test_scenario_must_fit_the_simulator(tmp_path: Path) -> None:
    # GIVEN an Azure scenario, and one that refers to a VM that is not served
    azure = load_scenario("azure-redeploy")
    needs_two = load_scenario(
        write(
            tmp_path,
            "two.json",
            {
                "cloud": "gce",
                "vms": ["a"],
                "steps": [{"at": 1, "gce": {"vm": "$1", "key": "preempted", "value": True}}],
            },
        )
    )
    # WHEN simulators are built that cannot serve them
    # THEN the mismatch is reported before anything runs
    with pytest.raises(ScenarioError, match="--cloud azure"):
        Simulator(cloud="gce", scenario=azure)
    with pytest.raises(ScenarioError, match=r"step 0: field 'gce.vm'.*--vm-name"):
        Simulator(scenario=needs_two)


def test_a_step_that_no_longer_applies_is_logged_not_fatal(start_sim: StartSim, tmp_path: Path) -> None:
    # GIVEN a scenario that cancels an event after it started, then adds another one
    path = write(
        tmp_path,
        "late-cancel.json",
        {
            "cloud": "azure",
            "steps": [
                {"at": 10, "add": {"event_type": "Freeze", "event_id": "LATE"}},
                {"at": 20, "advance": "LATE"},
                {"at": 30, "cancel": "LATE"},
                {"at": 40, "add": {"event_type": "Reboot", "event_id": "NEXT"}},
            ],
        },
    )
    vm = clients(start_sim(scenario=path))[0]
    # WHEN the scenario runs past its steps
    vm.advance(45)
    # THEN the refused cancel is in the log and the rest of the timeline still ran
    assert [(e["EventId"], e["EventStatus"]) for e in vm.events()["Events"]] == [
        ("LATE", "Started"),
        ("NEXT", "Scheduled"),
    ]
    assert any("step 2 (cancel LATE) not applied" in e["message"] for e in vm.get_list("log"))


def test_yaml_without_pyyaml_says_what_to_install(tmp_path: Path) -> None:
    # GIVEN a Python where PyYAML cannot be imported
    path = write(tmp_path, "plain.yaml", "cloud: azure\nsteps:\n  - at: 1\n    fault: {drop: 1}\n")
    code = (
        "import sys; sys.modules['yaml'] = None\n"
        "from simulator import load_scenario, ScenarioError\n"
        f"try:\n    load_scenario({path!r})\nexcept ScenarioError as exc:\n    print(exc)\n"
    )
    # WHEN the YAML file is loaded there
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=30)
    # THEN the error says how to fix it
    assert "install PyYAML (pip install pyyaml) or use a JSON scenario file" in result.stdout, result.stderr
