"""Which release is running: `mbridge --version`, `mbridge agent --version`, the agent's start-up log
line and its /healthz all say it, from the one place that knows it (wire.version)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from agent.health import HealthServer, Metrics, Readiness
from simulator import Simulator
from tests.agent_runner import ROOT, AgentProcess
from tests.waiting import wait_until
from wire.version import version


@pytest.mark.parametrize("argv", [["--version"], ["agent", "--version"]], ids=["mbridge", "mbridge agent"])
def test_version_is_printed_and_exits_0(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mbridge.cli", *argv], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"mbridge {version()}\n"
    # the installed release, not a placeholder
    assert version() != "unknown"


def test_healthz_carries_the_version() -> None:
    server = HealthServer(
        "127.0.0.1",
        0,
        metrics=Metrics(),
        readiness=Readiness(follows_commands=False),
        liveness=lambda: {"healthy": True, "threads": {"poller": True}},
    )
    server.start()
    try:
        answer = requests.get(f"{server.address}/healthz", timeout=5)
    finally:
        server.stop()
    assert answer.status_code == 200
    assert answer.json() == {"healthy": True, "threads": {"poller": True}, "version": version()}


def test_the_start_up_log_line_carries_the_version(
    tmp_path: Path, agent_process: Callable[[list[str]], AgentProcess]
) -> None:
    with Simulator(cloud="azure", vm_names=["vm-0"]) as sim:
        agent = agent_process(
            ["--cloud", "azure", "--metadata-url", sim.base_urls[0], "--vm-name", "vm-0", "--listen", "off",
             "--state-dir", str(tmp_path / "state"), "--jsonl-path", str(tmp_path / "events.jsonl")]
        )  # fmt: skip
        wait_until(lambda: "starting" in agent.log(), 30, agent.log)
        agent.signal(signal.SIGTERM)
        assert agent.wait() == 0
    first = json.loads(agent.log().splitlines()[0])
    assert first["version"] == version(), first
    assert version() in first["message"]
