"""The real agent as a child process (`mbridge agent ...`), as it runs on a VM.

A process of its own, so that its CPU time and memory can be read from /proc without the
benchmark's own threads in them, and so that nothing it does competes for the benchmark's
interpreter lock. Its log (JSON lines on stderr) goes to a file in the section's directory.
As deployed, an agent on a transport with commands is given a verification key (`--verify-key`,
one key pair made for the run) and proves its VM's identity on every message (the default).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.results import ROOT
from wire.signing import generate_keypair

# The agent's Python threads after its main thread, in the order it starts them (agent/main.py starts
# the health server, then Agent.run the publisher, the recorder, the watcher and the command loop): how
# the CPU breakdown names them, since Python threads carry no name of their own in /proc.
AGENT_THREADS = ("health", "publisher", "recorder", "watcher", "commands")

STOP_TIMEOUT = 15.0  # the agent flushes its outbox for up to 10 s on SIGTERM
LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class AgentOptions:
    cloud: str
    metadata_url: str
    vm_name: str
    transport: str = "local"
    poll_interval: float = 1.0
    extra: tuple[str, ...] = ()  # further flags, e.g. a transport's
    env: Mapping[str, str] | None = None  # added to the environment (MBRIDGE_* variables are removed)


@dataclass
class AgentProcess:
    label: str
    process: subprocess.Popen[bytes]
    state_dir: Path
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def require_running(self) -> None:
        if not self.running:
            code = self.process.returncode
            raise RuntimeError(f"agent {self.label} exited with {code}; log tail ({self.log_path}):\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM (the agent stops watching and flushes), then SIGKILL if it does not end in time."""
        stop_all([self])

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def stop_all(agents: Sequence[AgentProcess]) -> None:
    """Stop agents together: SIGTERM to each, then wait for each (SIGKILL after STOP_TIMEOUT)."""
    running = [agent for agent in agents if agent.process.poll() is None]
    for agent in running:
        agent.process.send_signal(signal.SIGTERM)
    for agent in running:
        try:
            agent.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            agent.process.kill()
            agent.process.wait(timeout=STOP_TIMEOUT)


def agent_command() -> list[str]:
    """The installed console script when there is one (what a VM runs), else the module."""
    script = Path(sys.executable).parent / "mbridge"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mbridge.cli"]


@functools.cache
def verify_key() -> str:
    """The public key of a command-signing key pair made for this run (PEM), as an agent's
    --verify-key takes it: deployed agents on a transport with commands execute signed ones only."""
    _, public = generate_keypair()
    return public.decode("ascii")


def agent_arguments(options: AgentOptions, state_dir: Path) -> list[str]:
    signed = () if options.transport == "jsonl" or "--verify-key" in options.extra else ("--verify-key", verify_key())
    return [
        "agent",
        "--cloud",
        options.cloud,
        "--metadata-url",
        options.metadata_url,
        "--vm-name",
        options.vm_name,
        "--state-dir",
        str(state_dir),
        "--transport",
        options.transport,
        "--poll-interval",
        f"{options.poll_interval:g}",
        "--listen",
        "127.0.0.1:0",  # the health endpoints run, as by default, on a port of their own
        *signed,
        *options.extra,
    ]


def clean_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without MBRIDGE_* settings (flags decide everything), plus `extra`."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MBRIDGE_")}
    environment.update(extra or {})
    return environment


def start_agent(label: str, options: AgentOptions, directory: Path) -> AgentProcess:
    """Start the agent with its state in `directory/<label>`; returns at once (see `wait_until`)."""
    state_dir = directory / label
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = directory / f"{label}.log"
    command: Sequence[str] = [*agent_command(), *agent_arguments(options, state_dir)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603 - our own console script with our own flags
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            env=clean_environment(options.env),
        )
    return AgentProcess(label=label, process=process, state_dir=state_dir, log_path=log_path)


def wait_until(agent: AgentProcess, condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait until `condition()` is true while the agent keeps running; raise saying what did not happen."""
    deadline = time.monotonic() + timeout
    while not condition():
        agent.require_running()
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"agent {agent.label}: {what} did not happen within {timeout:.0f} s:\n{agent.log_tail()}"
            )
        time.sleep(0.02)


def describe_threads(ms_per_poll: dict[str, float], total_ms: float) -> str:
    """Where a poll's CPU time went, busiest thread first (threads that ended in between are not listed)."""
    shares = sorted(ms_per_poll.items(), key=lambda share: -share[1])
    text = ", ".join(f"{role} {ms:.3f}" for role, ms in shares if ms >= 0.0005)
    unlisted = total_ms - sum(ms_per_poll.values())
    if unlisted >= 0.0005:
        text += f", threads that ended {unlisted:.3f}"
    return f"by thread (Python threads named by start order), ms/poll: {text}"
