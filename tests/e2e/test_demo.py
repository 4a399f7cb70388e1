"""`mbridge demo` on the embedded bus, run as the README runs it, and checked from the outside:
its exit code and timeline, the HTML report, and the audit log it leaves behind."""

from __future__ import annotations

import argparse
import io
import json
import shlex
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from functions.core.policy import load_policy
from functions.local_app.replay import replay, reporter_names
from functions.local_app.store import SqliteStore
from mbridge.demo import flows as demo_flows
from mbridge.demo.cli import run_flows
from mbridge.demo.flows import FLOWS, Expectation, drained
from mbridge.demo.timeline import STAGES

ROOT = Path(__file__).resolve().parents[2]
IMPORT_GUARD = Path(__file__).with_name("import_guard.py")

# The stages each flow must not reach (everything else it must): no approval and no start for
# what is drained only or canceled, nothing restored for what is gone or never drained, no end
# for what only a VM that the event deletes could report (on a bus whose functions read no
# control-plane feed; here the control plane reports it), nothing from the VM whose agent is dead.
NOT_REACHED = {
    "freeze": {"drained", "restored"},
    "user-reboot": set(),
    "spot-preempt": {"restored"},
    "scale-in": {"restored"},
    "gce-migration": {"approved", "started"},
    "platform-reboot": set(),
    "redeploy-canceled": {"approved", "started"},
    "gce-terminate": {"approved", "started"},
    # refused forgeries: nothing at all happens for the forged event
    "forged-reboot": set(STAGES),
    "genuine-reboot": set(),
    "dead-agent": {"detected", "published", "approved", "started"},
    "gce-dead-agent": {"detected", "published", "approved", "started"},
}
# gce-0's actions: the live migration and the host maintenance on its agent's reports, then its
# maintenance window on the system-event log's alone (audited while scheduled, drained once open)
GCE_ACTIONS = [("drain", "6-gce"), ("restore", "1-ended")] * 2 + [
    ("none", "6-gce-upcoming"),
    ("drain", "2-started"),
    ("restore", "1-ended"),
]

# (drained, approved by one of, restored) per Azure event, read back from the audit log: each VM of
# an event is moved by its own report only, and the event is approved once (an approval starts it
# for every VM it names): by the first report of a harmless Freeze, by the report that finds every
# VM out of its pool otherwise.
AZURE_ACTIONS = {
    demo_flows.FREEZE_ID: ([], ["web-0", "web-1"], []),
    demo_flows.USER_REBOOT_ID: (["web-2"], ["web-2"], ["web-2"]),
    demo_flows.SPOT_ID: (["spot-0"], ["spot-0"], []),
    demo_flows.SCALE_IN_ID: (["vmss-0"], ["vmss-0"], []),
    demo_flows.PLATFORM_REBOOT_ID: (["web-0", "web-1"], ["web-0", "web-1"], ["web-0", "web-1"]),
    demo_flows.REDEPLOY_ID: (["web-2"], ["web-2"], ["web-2"]),
    demo_flows.FORGED_ID: ([], [], []),
    demo_flows.GENUINE_ID: (["web-0"], ["web-0"], ["web-0"]),
    demo_flows.DEAD_AGENT_ID: (["web-2"], [], ["web-2"]),
}


@dataclass(frozen=True)
class DemoRun:
    finished: subprocess.CompletedProcess[str]
    report: Path
    workdir: Path


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The demo, run once as `make demo` runs it, with only what the demo extra installs importable."""
    tmp_path = tmp_path_factory.mktemp("demo")
    report = tmp_path / "report.html"
    workdir = tmp_path / "work"
    finished = subprocess.run(
        [sys.executable, str(IMPORT_GUARD), "demo", "mbridge.cli", "demo",
         "--report", str(report), "--workdir", str(workdir)],
        capture_output=True, text=True, timeout=140, cwd=ROOT,
    )  # fmt: skip
    return DemoRun(finished, report, workdir)


@pytest.mark.timeout(150)
def test_the_demo_holds_every_expectation_and_leaves_a_report_and_an_audit_log(demo_run: DemoRun) -> None:
    # WHEN the demo runs as `make demo` runs it, with only what the demo extra installs importable
    finished, report, workdir = demo_run.finished, demo_run.report, demo_run.workdir

    # THEN it passed every check, within its time budget
    out = finished.stdout
    assert finished.returncode == 0, out + finished.stderr
    checks = sum(len(flow.expectations) for flow in FLOWS) + 2
    assert f"{checks}/{checks} expectations held" in out
    assert "✗" not in out

    # AND each flow's row of the summary shows exactly the stages it must reach
    rows = {line.split()[0]: line.split()[1 : 1 + len(STAGES)] for line in out.splitlines() if line.split()[:1]}
    for flow in FLOWS:
        cells = dict(zip(STAGES, rows[flow.key]))
        assert {stage for stage, cell in cells.items() if cell == "-"} == NOT_REACHED[flow.key], flow.key

    # AND the report is one self-contained page with a lane per flow
    page = report.read_text(encoding="utf-8")
    assert "passed" in page
    assert "<script" not in page
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert all(f">{flow.key}<" in page for flow in FLOWS)

    # AND the audit log holds each action once, as the policy promises
    store = SqliteStore(workdir / "functions.db")
    try:
        for event_id, (drains, approvers, restores) in AZURE_ACTIONS.items():
            actions = [(r.action, r.vm) for r in store.query(event_id=event_id) if r.kind == "action"]
            assert sorted(vm for action, vm in actions if action == "drain") == drains, event_id
            approved = [vm for action, vm in actions if action == "approve"]
            assert len(approved) == (1 if approvers else 0), event_id
            assert set(approved) <= set(approvers), event_id
            assert sorted(vm for action, vm in actions if action == "restore") == restores, event_id
        gce = [(r.action, r.rule) for r in store.query(vm="gce-0") if r.kind == "action"]
        assert gce == GCE_ACTIONS
        # the forgeries: refused, and why, in the audit log
        refused = [(r.kind, r.event_id.upper()) for r in store.query() if r.kind in ("unverified", "not-self")]
        assert sorted(refused) == sorted(
            [
                ("not-self", demo_flows.FORGED_ID),
                ("unverified", demo_flows.FORGED_ID),
                ("unverified", demo_flows.GENUINE_ID),
            ]
        )
        # the dead agents: web-2 found silent once, by Event Grid's report of its event; gce-0 twice,
        # by the log's report of its window scheduled and then open; no live agent ever
        silent = [(r.vm, r.event_id.upper(), r.status) for r in store.query() if r.kind == "agent-silent"]
        assert [(vm, status) for vm, _, status in silent] == [
            (demo_flows.DEAD_VM, "scheduled"),
            (demo_flows.GCE_VM, "scheduled"),
            (demo_flows.GCE_VM, "started"),
        ]
        assert silent[0][1] == demo_flows.DEAD_AGENT_ID
        results = {r.event_id.upper(): r.action for r in store.query() if r.kind == "command-result"}
        assert results[demo_flows.REDEPLOY_ID] == "rejected"  # the agent re-checked IMDS: canceled
        assert results[demo_flows.PLATFORM_REBOOT_ID] == "accepted"
    finally:
        store.close()


# What the audit log and `mbridge replay` both say of each (event, VM): its actions, and the refusals
# and findings that moved nothing (docs/contracts.md#replay-output).
TOLD = frozenset({"action", "unverified", "not-self", "malformed", "agent-silent"})
Story = dict[tuple[str, str], set[str]]


def told(entries: Iterable[tuple[str, str, str, str]]) -> Story:
    """(event id, VM) → the actions, and the kinds of the other records told, from (kind, action, event, VM)."""
    story: Story = defaultdict(set)
    for kind, action, event_id, vm in entries:
        if kind in TOLD:
            story[(event_id, vm)].add(action if kind == "action" else kind)
    return dict(story)


@pytest.mark.timeout(150)
def test_replaying_what_the_demo_recorded_tells_what_its_audit_log_says(demo_run: DemoRun) -> None:
    # GIVEN the demo's run, whose closing lines say where it recorded what its functions took, and how to replay it
    assert demo_run.finished.returncode == 0, demo_run.finished.stdout + demo_run.finished.stderr
    recorded = demo_run.workdir / "recorded.jsonl"
    (said,) = [line for line in demo_run.finished.stdout.splitlines() if line.startswith(f"recorded: {recorded}")]
    # the command names this installation's mbridge (a path, or `mbridge` when that one is on the PATH)
    command = shlex.split(said[said.index("replay it with `") + len("replay it with `") : -1])
    assert command[1] == "replay", command
    assert Path(command[0]).name == "mbridge", command

    # WHEN it is replayed as it says (its policy, and the trust file its functions verified with)
    replayed = subprocess.run([command[0], *command[1:]], capture_output=True, text=True, timeout=60, cwd=ROOT)

    # THEN replay says it checked the proofs with that trust file
    assert replayed.returncode == 0, replayed.stderr
    assert f"trust: proofs checked with the trust file {demo_run.workdir / 'trust.json'}" in replayed.stderr
    # AND for each event and VM, it tells the very actions and refusals the audit log holds
    lines = [json.loads(line) for line in replayed.stdout.splitlines()]
    story = told((line["kind"], line["action"], line["event_id"], line["vm"]) for line in lines)
    store = SqliteStore(demo_run.workdir / "functions.db")
    try:
        audited = told((r.kind, r.action, r.event_id, r.vm) for r in store.query())
    finally:
        store.close()
    assert story == audited
    # (every flow is in it, the forgeries refused as the functions refused them, the dead agent found silent)
    assert {event_id.upper() for event_id, _ in story} >= set(AZURE_ACTIONS)
    assert story[(demo_flows.FORGED_ID, "web-0")] == {"unverified"}
    assert "unverified" in story[(demo_flows.GENUINE_ID, "web-0")]
    assert "agent-silent" in story[(demo_flows.DEAD_AGENT_ID, demo_flows.DEAD_VM)]

    # AND taking every reporter at its word instead tells another story: the forged Reboot of web-0 drains it
    out, err = io.StringIO(), io.StringIO()
    policy = load_policy((demo_run.workdir / "policy.json").read_text(encoding="utf-8"))
    with recorded.open(encoding="utf-8") as inputs:
        assert replay(inputs, policy, reporter_names(), out, err) == 0
    credulous = told(
        (line["kind"], line["action"], line["event_id"], line["vm"])
        for line in map(json.loads, out.getvalue().splitlines())
    )
    assert "drain" in credulous[(demo_flows.FORGED_ID, "web-0")]


@pytest.mark.timeout(90)
def test_a_failed_expectation_exits_1_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN only the Freeze flow, made to expect a drain the policy never does
    (freeze,) = [flow for flow in FLOWS if flow.key == "freeze"]
    wrong: Expectation = drained("web-0")
    args = argparse.Namespace(bus="embedded", report=None, workdir=tmp_path, speed=10.0, drain_period=3.0)

    # WHEN the demo plays it
    code = run_flows(args, [replace(freeze, expectations=(wrong, *freeze.expectations))])

    # THEN it exits 1 and names the first expectation that did not hold, with what was seen
    assert code == 1
    err = capsys.readouterr().err
    assert "FAILED: 5 s Freeze on web-0, web-1: drained web-0 — seen: drained []" in err
