"""`mbridge agent` as a process: what it prints, how it stops, and what survives a SIGKILL."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from agent.state import AgentState
from simulator import Simulator, load_scenario
from tests.agent_runner import ROOT, AgentProcess, play_to_the_end
from tests.waiting import wait_until
from wire.signing import generate_keypair


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.slow
def test_documented_live_migration_prints_exactly_three_cloudevents(tmp_path: Path) -> None:
    # GIVEN the documented live-migration example served by the simulator
    with Simulator(scenario=load_scenario("azure-live-migration")) as sim:
        # WHEN `mbridge agent --cloud azure --metadata-url <simulator> --vm-name WestNO_0 --transport jsonl` runs
        agent = subprocess.Popen(
            [sys.executable, "-m", "mbridge.cli", "agent", "--cloud", "azure", "--metadata-url", sim.base_urls[0],
             "--vm-name", "WestNO_0", "--transport", "jsonl", "--state-dir", str(tmp_path), "--listen", "off"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )  # fmt: skip
        try:
            play_to_the_end(sim, settle=2.5)
            time.sleep(1.5)
        finally:
            agent.send_signal(signal.SIGTERM)
            stdout, stderr = agent.communicate(timeout=20)

    # THEN it printed exactly three CloudEvents, scheduled → started → completed, with one event_id,
    # and SIGTERM made it exit 0
    assert agent.returncode == 0, stderr.decode()
    envelopes = [json.loads(line) for line in stdout.decode().splitlines()]
    assert [e["type"] for e in envelopes] == [
        "org.maintenancebridge.maintenance.scheduled",
        "org.maintenancebridge.maintenance.started",
        "org.maintenancebridge.maintenance.completed",
    ]
    assert {e["data"]["event_id"] for e in envelopes} == {"C7061BAC-AFDC-4513-B24B-AA5F13A16123"}
    # ... and its log on stderr is JSON lines
    assert all(json.loads(line)["logger"] for line in stderr.decode().splitlines())


@pytest.mark.slow
def test_sigkill_mid_publish_loses_nothing_and_keeps_ids_stable(tmp_path: Path) -> None:
    # GIVEN 120 events appearing at once, and an agent that publishes to a pipe read slowly, so its
    # writes block and a kill lands while envelopes are still waiting in its outbox
    state_dir = tmp_path / "state"
    collected: list[dict[str, Any]] = []
    killed_with_pending: list[int] = []
    with Simulator(cloud="azure", vm_names=["vm-0"]) as sim:
        args = [sys.executable, "-m", "mbridge.cli", "agent", "--cloud", "azure", "--metadata-url", sim.base_urls[0],
                "--vm-name", "vm-0", "--transport", "jsonl", "--state-dir", str(state_dir), "--listen", "off",
                "--poll-interval", "0.25"]  # fmt: skip
        ids = [f"E{n:03d}" for n in range(120)]
        for event_id in ids:
            requests.post(
                f"{sim.base_urls[0]}/_sim/events",
                json={"event_type": "Reboot", "resources": ["vm-0"], "event_id": event_id},
                timeout=5,
            )

        # WHEN the agent is killed with SIGKILL at random moments while the events start and complete
        rng = random.Random(7)
        for round_ in range(6):
            agent = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
            reader = threading.Thread(target=_read_slowly, args=(agent, collected))
            reader.start()
            time.sleep(rng.uniform(0.6, 1.2))
            if round_ in (1, 3):
                for event_id in ids:
                    requests.post(f"{sim.base_urls[0]}/_sim/events/{event_id}/advance", timeout=5)
            agent.send_signal(signal.SIGKILL)
            agent.wait(timeout=10)
            reader.join(timeout=30)
            killed_with_pending.append(_pending_rows(state_dir))

        # AND finally runs undisturbed until all is out
        survivor = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
        reader = threading.Thread(target=_read_slowly, args=(survivor, collected, 0.0))
        reader.start()
        wait_until(lambda: _facts(collected) >= 360, 60, lambda: f"360 facts, got {_facts(collected)}")
        time.sleep(0.5)
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(timeout=20) == 0
        reader.join(timeout=10)

    # THEN at least one kill really hit a non-empty outbox ...
    assert any(killed_with_pending), killed_with_pending
    # ... every (event, status) was published, in lifecycle order per event, and a duplicate
    # (a row published but not yet marked when the kill came) carries the same id as its original
    firsts: dict[str, list[str]] = {}
    ids_by_fact: dict[tuple[str, str], set[str]] = {}
    for envelope in collected:
        event_id, status = envelope["data"]["event_id"], envelope["data"]["status"]
        ids_by_fact.setdefault((event_id, status), set()).add(envelope["id"])
        if status not in firsts.setdefault(event_id, []):
            firsts[event_id].append(status)
    assert sorted(firsts) == ids
    assert all(order == ["scheduled", "started", "completed"] for order in firsts.values()), firsts
    assert all(len(found) == 1 for found in ids_by_fact.values())
    assert len(ids_by_fact) == 360


def _read_slowly(agent: subprocess.Popen[bytes], into: list[dict[str, Any]], pause: float = 0.02) -> None:
    """A slow consumer: the pipe fills and the agent's writes block mid-publish."""
    assert agent.stdout is not None
    for line in agent.stdout:
        into.append(json.loads(line))
        time.sleep(pause)


def _facts(envelopes: list[dict[str, Any]]) -> int:
    return len({(e["data"]["event_id"], e["data"]["status"]) for e in envelopes})


def _pending_rows(state_dir: Path) -> int:
    state = AgentState(state_dir / "agent.db")
    try:
        return state.depth()
    finally:
        state.close()


def _outbox_empty(port: int) -> bool:
    try:
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except requests.ConnectionError:
        return False
    return "mbridge_outbox_depth 0\n" in metrics and "mbridge_polls_total" in metrics


def test_health_readiness_and_metrics_endpoints(
    tmp_path: Path, agent_process: Callable[[list[str]], AgentProcess]
) -> None:
    # GIVEN an agent without a command channel (jsonl) and its health endpoints
    port = free_port()
    with Simulator(cloud="azure", vm_names=["vm-0"]) as sim:
        agent_process(["--cloud", "azure", "--metadata-url", sim.base_urls[0], "--vm-name", "vm-0",
                       "--jsonl-path", str(tmp_path / "e.jsonl"), "--state-dir", str(tmp_path),
                       "--listen", f"127.0.0.1:{port}", "--poll-interval", "0.25"])  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _ok(f"{base}/healthz"), 20, "/healthz")
        # ready once the metadata service answered (tests/unit/agent/test_blind_agent.py: not before)
        wait_until(lambda: _ok(f"{base}/readyz"), 20, "/readyz ready after the first poll")

        # WHEN an impactful event for this VM is scheduled
        requests.post(
            f"{sim.base_urls[0]}/_sim/events", json={"event_type": "Redeploy", "resources": ["vm-0"]}, timeout=5
        )

        # THEN /readyz turns unready (a health-probe load balancer drains the VM) and metrics count it
        wait_until(lambda: requests.get(f"{base}/readyz", timeout=5).status_code == 503, 20, "unready")
        assert "redeploy" in requests.get(f"{base}/readyz", timeout=5).json()["reason"]
        # (the first message waits for the VM's attested document, asked for once)
        wait_until(lambda: _outbox_empty(port), 20, "the outbox published")
        metrics = requests.get(f"{base}/metrics", timeout=5).text
        for name in (
            "mbridge_polls_total",
            "mbridge_events_published_total",
            "mbridge_outbox_depth 0",
            "mbridge_seconds_since_last_good_poll",
            "mbridge_detection_lag_seconds_count",
        ):
            assert name in metrics, name


def _ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


def test_check_reports_healthy_against_the_simulator(tmp_path: Path) -> None:
    with Simulator(cloud="azure", vm_names=["vm-0"]) as sim:
        done = subprocess.run(
            [sys.executable, "-m", "mbridge.cli", "agent", "--check", "--cloud", "azure", "--metadata-url",
             sim.base_urls[0], "--transport", "local", "--state-dir", str(tmp_path),
             "--verify-key", generate_keypair()[1].decode(), "--listen", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "this VM's name: vm-0" in done.stdout
    assert done.stdout.strip().endswith("healthy")


def test_check_names_the_problem_when_metadata_is_unreachable(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mbridge.cli", "agent", "--check", "--cloud", "gce", "--metadata-url",
         f"http://127.0.0.1:{free_port()}", "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1
    assert "PROBLEM metadata service" in done.stdout
    assert "--vm-name" in done.stdout


def test_bad_settings_exit_2_with_the_flag_to_fix(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mbridge.cli", "agent", "--cloud", "azure", "--poll-interval", "0.05",
         "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--poll-interval" in done.stderr
    assert "MBRIDGE_POLL_INTERVAL" in done.stderr
