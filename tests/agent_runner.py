"""Run the real agent against the real simulator: in a thread (fast) or as a process (signals).

Registered as a pytest plugin in tests/conftest.py, so every test folder can use its fixtures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import pytest

from agent.config import AgentSettings
from agent.main import run_agent
from simulator import Simulator
from tests.waiting import wait_until
from wire.model import Cloud
from wire.transports.base import AgentTransport

ROOT = Path(__file__).resolve().parents[1]


def settings_for(cloud: str, url: str, vm_name: str, state_dir: Path, **overrides: Any) -> AgentSettings:
    settings = AgentSettings(
        cloud=Cloud(cloud),
        metadata_url=url,
        vm_name=vm_name,
        transport="jsonl",
        jsonl_path=str(state_dir / "events.jsonl"),
        state_dir=state_dir,
        bus_path=state_dir / "bus.db",
        poll_interval=0.25,
        listen=None,
        dry_run=False,
        verify_key=None,
        servicebus_namespace=None,
        servicebus_connection_string=None,
        servicebus_topic="maintenance-events",
        servicebus_commands_queue="maintenance-commands",
        pubsub_project=None,
        pubsub_topic="maintenance-events",
        pubsub_commands_subscription=None,
        flush_seconds=5.0,
    )
    return replace(settings, **overrides)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def play_to_the_end(sim: Simulator, settle: float = 0.7, slack: float = 15.0) -> None:
    """Drive a scenario by jumping the simulator's clock from one timeline entry to the next,
    after giving the agent `settle` real seconds to see each state (several polls at 0.25 s).
    Deterministic and fast, whatever the documented timings.

    On Azure the clock moves on only once IMDS has also answered two requests since the last jump
    (the second began after it), waiting up to `slack` more seconds: on a loaded machine a poll can
    come late, or be refused (429, its requests bunched on their way) and retried after a backoff,
    and a state the agent never read would be missed by the test, not by the agent. (A GCE agent
    long-polls: its next answer comes with the next change, so only `settle` applies there.)"""
    while True:
        answered = _answered(sim)
        time.sleep(settle)
        deadline = time.monotonic() + slack
        while sim.cloud.value == "azure" and _answered(sim) < answered + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        state: dict[str, Any] = sim.state()  # also once a deleted VM's port is closed
        if not state["timeline"]:
            return
        due = state["timeline"][0]["at"] - state["clock"]["sim_time"]
        sim.advance_clock(max(due, 0.0) + 0.001)


def _answered(sim: Simulator) -> int:
    """The metadata requests the simulator answered with 200, over all its VMs."""
    return sum(traffic["by_status"].get("200", 0) for traffic in sim.traffic().values())


@dataclass
class AgentThread:
    settings: AgentSettings
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    exit_code: int | None = None

    transport: AgentTransport | None = None

    def start(self) -> AgentThread:
        def run() -> None:
            self.exit_code = run_agent(self.settings, self.stop, transport=self.transport)

        self.thread = threading.Thread(target=run, name=f"agent-{self.settings.vm_name}", daemon=True)
        self.thread.start()
        return self

    def envelopes(self) -> list[dict[str, Any]]:
        return read_jsonl(Path(self.settings.jsonl_path))

    def statuses(self) -> list[tuple[str, str, str]]:
        """(kind, status, event_id) of every envelope so far."""
        return [(e["data"]["kind"], e["data"]["status"], e["data"]["event_id"]) for e in self.envelopes()]

    def wait_for_count(self, count: int, timeout: float = 20.0) -> list[dict[str, Any]]:
        wait_until(lambda: len(self.envelopes()) >= count, timeout, lambda: f"{count} envelopes, got {self.statuses()}")
        return self.envelopes()

    def halt(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=15)
            assert not self.thread.is_alive(), "the agent did not stop within 15 s"


@pytest.fixture
def agent_thread() -> Iterator[Callable[..., AgentThread]]:
    started: list[AgentThread] = []

    def start(settings: AgentSettings, transport: AgentTransport | None = None) -> AgentThread:
        agent = AgentThread(settings, transport=transport).start()
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.halt()


@dataclass
class AgentProcess:
    """`mbridge agent` as a separate process, as systemd would run it."""

    args: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        self.launch(stdout=subprocess.DEVNULL)
        return self

    def launch(self, *, stdout: int) -> subprocess.Popen[bytes]:
        """Start the process, its standard error appended to `log_path`."""
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mbridge.cli", "agent", *self.args],
                stdout=stdout,
                stderr=log,
                cwd=ROOT,
                env=env,
            )
        return self.process

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait(self, timeout: float = 20.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def agent_process(tmp_path: Path) -> Iterator[Callable[[list[str]], AgentProcess]]:
    started: list[AgentProcess] = []

    def start(args: list[str]) -> AgentProcess:
        process = AgentProcess(args, tmp_path / f"agent-{len(started)}.log").start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
