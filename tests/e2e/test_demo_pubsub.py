"""`mbridge demo --bus pubsub-emulator`, run as a user would, and checked from the outside: its
exit code and timeline, the HTML report, the audit log it exported from Firestore, its logs, and
that nothing it started is left running. Without the emulators it must say what to install."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mbridge.demo import flows as demo_flows
from mbridge.demo.emulators import (
    FIRESTORE,
    PUBSUB,
    EmulatorMissingError,
    emulator_launcher,
    gcloud_sdk_root,
)
from mbridge.demo.flows import FLOWS
from mbridge.demo.timeline import STAGES
from tests.e2e.test_demo import AZURE_ACTIONS as EMBEDDED_AZURE_ACTIONS
from tests.e2e.test_demo import GCE_ACTIONS
from tests.e2e.test_demo import NOT_REACHED as EMBEDDED_NOT_REACHED
from tests.peers import require_peer
from wire.model import Cloud

ROOT = Path(__file__).resolve().parents[2]

# The flows played here: the Cloud Functions read GCE's control-plane feed (the system-event log),
# not Azure's, so the Azure dead agent's flow is not played (the demo says so).
PLAYED = tuple(flow for flow in FLOWS if flow.agent_down is None or flow.cloud is Cloud.GCE)
# The stages each flow must not reach, and what each Azure event did, as on the embedded bus; but no
# end of a deleted VM's event here: only the control plane could report it.
NOT_REACHED = {
    **EMBEDDED_NOT_REACHED,
    "spot-preempt": {"completed", "restored"},
    "scale-in": {"completed", "restored"},
}
AZURE_ACTIONS = {
    event_id: actions for event_id, actions in EMBEDDED_AZURE_ACTIONS.items() if event_id != demo_flows.DEAD_AGENT_ID
}
# A Spot eviction gives 30 documented seconds of notice, 3 real seconds at the demo's speed: the
# approval is sent at once, but an invocation of a function that has just started (cold clients,
# Firestore transactions contending on the emulator) can take longer than that. Then the agent
# finds the eviction Started and its POST is refused; no expectation of the flow depends on it.
MAY_BE_MISSED = {"spot-preempt": {"approved"}}


def require_emulators() -> None:
    sdk_root = gcloud_sdk_root()
    try:
        for emulator in (PUBSUB, FIRESTORE):
            emulator_launcher(emulator, sdk_root)
    except EmulatorMissingError as exc:
        require_peer(False, str(exc))


def read_audit(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def listening(host: str) -> bool:
    address, _, port = host.rpartition(":")
    try:
        with socket.create_connection((address, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.peer
@pytest.mark.timeout(180)
def test_the_demo_on_the_emulators_holds_every_expectation_and_leaves_its_audit_log(tmp_path: Path) -> None:
    require_emulators()

    # WHEN the demo runs on Google's emulators and the functions framework
    report = tmp_path / "report.html"
    workdir = tmp_path / "work"
    finished = subprocess.run(
        [sys.executable, "-m", "mbridge.cli", "demo", "--bus", "pubsub-emulator",
         "--report", str(report), "--workdir", str(workdir)],
        capture_output=True, text=True, timeout=170, cwd=ROOT,
    )  # fmt: skip

    # THEN it passed every check, within its time budget
    out = finished.stdout
    assert finished.returncode == 0, out + finished.stderr
    checks = sum(len(flow.expectations) for flow in PLAYED) + 2
    assert f"{checks}/{checks} expectations held" in out
    assert "✗" not in out
    assert "not played on this bus: Reboot of web-2, whose agent is down" in out

    # AND it said what it was waiting for while the emulators and the function started, before anything ran
    lines = out.splitlines()
    starting = next(i for i, line in enumerate(lines) if "starting the Pub/Sub and Firestore emulators" in line)
    ready = next(i for i, line in enumerate(lines) if "Pub/Sub emulator ready on 127.0.0.1:" in line)
    described = next(i for i, line in enumerate(lines) if re.search(r"\] Pub/Sub emulator 127\.0\.0\.1:\d+ \(", line))
    assert 0 < starting < ready < described, out

    # AND it said where everything runs
    hosts = re.findall(r"(?:Pub/Sub|Firestore) emulator (127\.0\.0\.1:\d+)", out)
    function = re.search(r"function: http://(127\.0\.0\.1:\d+)/", out)
    shim = re.search(r"Eventarc shim http://(127\.0\.0\.1:\d+)/", out)
    assert len(hosts) >= 2, out
    assert function is not None, out
    assert shim is not None, out

    # AND each flow's row of the summary shows the stages it must reach, and none it must not
    rows = {line.split()[0]: line.split()[1 : 1 + len(STAGES)] for line in out.splitlines() if line.split()[:1]}
    for flow in PLAYED:
        cells = dict(zip(STAGES, rows[flow.key]))
        missing = {stage for stage, cell in cells.items() if cell == "-"}
        optional = MAY_BE_MISSED.get(flow.key, set())
        assert NOT_REACHED[flow.key] <= missing <= NOT_REACHED[flow.key] | optional, flow.key

    # AND the report is one self-contained page with a lane per flow
    page = report.read_text(encoding="utf-8")
    assert "passed" in page
    assert "pubsub-emulator" in page
    assert "<script" not in page
    assert all(f">{flow.key}<" in page for flow in PLAYED)

    # AND the audit log exported from Firestore holds each action once, as the policy promises
    audit = read_audit(workdir / "audit.jsonl")
    for event_id, (drains, approvers, restores) in AZURE_ACTIONS.items():
        actions = [(r["action"], r["vm"]) for r in audit if r["kind"] == "action" and r["event_id"].upper() == event_id]
        assert sorted(vm for action, vm in actions if action == "drain") == drains, event_id
        approved = [vm for action, vm in actions if action == "approve"]
        assert len(approved) == (1 if approvers else 0), event_id  # one approval starts it for all
        assert set(approved) <= set(approvers), event_id
        assert sorted(vm for action, vm in actions if action == "restore") == restores, event_id
    gce = [(r["action"], r["rule"]) for r in audit if r["kind"] == "action" and r["vm"] == "gce-0"]
    assert gce == GCE_ACTIONS
    silent = [(r["vm"], r["status"]) for r in audit if r["kind"] == "agent-silent"]
    assert silent == [("gce-0", "scheduled"), ("gce-0", "started")]
    results = {r["event_id"].upper(): r["action"] for r in audit if r["kind"] == "command-result"}
    assert results[demo_flows.REDEPLOY_ID] == "rejected"  # the agent re-checked IMDS: canceled
    assert results[demo_flows.PLATFORM_REBOOT_ID] == "accepted"
    # The readiness commands came back over the bus from the agents that carried them out
    assert results["DRAIN-SPOT-0"] == "accepted"
    assert results["DRAIN-VMSS-0"] == "accepted"
    # ... every one of them: web-2 and gce-0 are drained and restored twice, seconds apart, and
    # each of those drains has commands of its own (none refused as a reused command id)
    readiness = [
        (r["event_id"], r["action"], r["reason"])
        for r in audit
        if r["kind"] == "command-result" and r["event_id"].startswith(("drain-", "restore-"))
    ]
    assert [event_id for event_id, _, _ in readiness].count("drain-web-2") == 2
    assert [event_id for event_id, _, _ in readiness].count("restore-web-2") == 2
    assert all(action == "accepted" for _, action, _ in readiness), readiness

    # AND every message went through the function served by the functions framework
    logs = workdir / "logs"
    function_log = (logs / "functions-framework.log").read_text(encoding="utf-8")
    assert '"result": "processed"' in function_log
    # and the control plane's through its own two: the log sink's entries and the ticks
    central_log = (logs / "functions-framework-on_central_log_entry.log").read_text(encoding="utf-8")
    assert "gce-system-event" in central_log
    assert "silent-agent sweep" in (logs / "functions-framework-on_central_tick.log").read_text(encoding="utf-8")
    assert (logs / "pubsub-emulator.log").exists()
    assert (logs / "firestore-emulator.log").exists()
    assert "push shim: message" in (workdir / "demo.log").read_text(encoding="utf-8")

    # AND nothing it started still listens
    for host in [*hosts, function.group(1), shim.group(1)]:
        assert not listening(host), host


def without_gcloud(tmp_path: Path) -> dict[str, str]:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {name: value for name, value in os.environ.items() if name not in ("CLOUDSDK_ROOT_DIR", "JAVA_HOME")}
    env["PATH"] = str(empty)
    return env


def sdk_without_emulators(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "CLOUDSDK_ROOT_DIR": str(tmp_path / "google-cloud-sdk")}


def sdk_without_java(tmp_path: Path) -> dict[str, str]:
    sdk_root = gcloud_sdk_root()
    require_peer(sdk_root is not None, "the Google Cloud CLI (gcloud) is not installed")
    return {**without_gcloud(tmp_path), "CLOUDSDK_ROOT_DIR": str(sdk_root)}


@pytest.mark.parametrize(
    ("environment", "says"),
    [
        (without_gcloud, "the Google Cloud CLI (gcloud) is not installed"),
        (sdk_without_emulators, "the Pub/Sub emulator is not installed at"),
        (sdk_without_java, "java was not found: the emulators need Java 17"),
    ],
    ids=["no-gcloud", "no-emulator", "no-java"],
)
@pytest.mark.timeout(60)
def test_without_an_emulator_the_demo_exits_2_saying_what_to_install(
    tmp_path: Path, environment: Any, says: str
) -> None:
    # GIVEN a machine where the lookup finds no emulator (or no Java)
    env = environment(tmp_path)

    # WHEN the demo is asked for the Pub/Sub variant
    finished = subprocess.run(
        [sys.executable, "-m", "mbridge.cli", "demo", "--bus", "pubsub-emulator", "--workdir", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=50, cwd=ROOT, env=env,
    )  # fmt: skip

    # THEN it exits 2 with one clear line saying what is missing and how to get it
    assert finished.returncode == 2, finished.stdout + finished.stderr
    assert "Traceback" not in finished.stderr
    assert says in finished.stderr
    if "java" not in says:
        assert "gcloud components install pubsub-emulator cloud-firestore-emulator" in finished.stderr
    assert "expectations held" not in finished.stdout


# ---- the pieces the demo adds around the product: the Eventarc shim, the policy, the clean-up


def test_a_pushed_message_reaches_the_entry_as_the_cloudevent_eventarc_delivers(tmp_path: Path) -> None:
    import base64

    import functions_framework
    from cloudevents.http import from_http

    from functions.gcp_app.entry import MESSAGE_PUBLISHED, message_body
    from mbridge.demo.eventarc_shim import eventarc_request

    # GIVEN a push body as the Pub/Sub emulator POSTs it
    topic = "projects/mbridge-demo/topics/maintenance-events"
    push = {
        "subscription": "projects/mbridge-demo/subscriptions/eventarc-local-mbridge-events-sub-000",
        "message": {
            "data": base64.b64encode(b"envelope").decode(),
            "attributes": {"vm": "web-0"},
            "messageId": "7",
            "message_id": "7",
            "publishTime": "2026-03-01T12:00:00.481Z",
            "publish_time": "2026-03-01T12:00:00.481Z",
        },
    }

    # WHEN the shim turns it into the function's request
    headers, body = eventarc_request(push, topic)

    # THEN the CloudEvents SDK reads it as a binary-mode messagePublished event of the topic
    event = from_http(headers, body)
    assert event["type"] == MESSAGE_PUBLISHED
    assert event["source"] == "//pubsub.googleapis.com/" + topic
    assert (event["id"], event["time"]) == ("7", "2026-03-01T12:00:00.481Z")
    data = event.get_data()
    assert isinstance(data, dict)
    assert data["subscription"] == push["subscription"]
    assert message_body(event) == b"envelope"

    # AND the functions framework hands a cloudevent function that same event, and says 200
    # (it loads the source as a module named after the file, and puts its folder on sys.path)
    name = "eventarc_shim_target"
    source = tmp_path / f"{name}.py"
    source.write_text(
        "import functions_framework\n"
        "from functions.gcp_app.entry import message_body\n"
        "SEEN = []\n"
        "@functions_framework.cloud_event\n"
        "def target(cloud_event):\n"
        "    SEEN.append((cloud_event['type'], message_body(cloud_event)))\n",
        encoding="utf-8",
    )
    try:
        app = functions_framework.create_app(  # type: ignore[no-untyped-call]  # the framework leaves it unannotated
            "target", str(source), "cloudevent"
        )
        response = app.test_client().post("/", data=body, headers=headers)
        seen = sys.modules[name].SEEN
    finally:
        sys.modules.pop(name, None)
        if str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))
    assert response.status_code == 200
    assert seen == [(MESSAGE_PUBLISHED, b"envelope")]


def test_a_push_that_is_not_a_pubsub_message_is_refused() -> None:
    from mbridge.demo.eventarc_shim import eventarc_request

    with pytest.raises(ValueError, match="not a Pub/Sub push body"):
        eventarc_request({"data": "x"}, "projects/p/topics/t")
    with pytest.raises(ValueError, match="no messageId"):
        eventarc_request({"message": {"data": ""}, "subscription": "s"}, "projects/p/topics/t")


def test_the_demo_policy_reaches_the_function_unchanged() -> None:
    from functions.core.policy import Policy, Pool, load_policy
    from mbridge.demo.pubsub_function import policy_document

    policy = Policy(
        drain_period_seconds=3.0,
        pools=(Pool("web", frozenset({"web-0", "web-1"}), 1),),
        maintenance_window_utc=(22, 4),
    )
    assert load_policy(policy_document(policy)) == policy
    assert load_policy(policy_document(Policy(drain_period_seconds=3.0))) == Policy(drain_period_seconds=3.0)


@pytest.mark.peer
@pytest.mark.timeout(120)
def test_a_start_that_fails_half_way_leaves_nothing_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from functions.core.policy import Policy
    from mbridge.demo import pubsub_world
    from mbridge.demo.errors import DemoSetupError

    require_emulators()
    # GIVEN a function source that cannot be imported: the emulators start, the function does not
    source = tmp_path / "source"
    source.mkdir()
    (source / "main.py").write_text("raise RuntimeError('no such function here')\n", encoding="utf-8")
    monkeypatch.setattr(pubsub_world, "REPO_ROOT", source)
    before = {name: os.environ.get(name) for name in (PUBSUB.variable, FIRESTORE.variable)}
    world = pubsub_world.PubSubWorld(tmp_path / "work", Policy(drain_period_seconds=3.0), 10.0)

    # WHEN it is started, and closed as the demo closes it
    try:
        with pytest.raises(DemoSetupError) as failure:
            world.start()
    finally:
        world.close()

    # THEN the error says which process failed, with its log
    assert "functions-framework exited" in str(failure.value)
    assert "no such function here" in str(failure.value)
    # AND the emulators it had started are gone, and the environment is as it was
    assert world.pubsub is not None
    assert world.firestore is not None
    for peer in (world.pubsub, world.firestore):
        assert not peer.running, peer.name
        assert not listening(peer.host), peer.name
    assert {name: os.environ.get(name) for name in before} == before
