"""`mbridge agent` as a process when its state fails: damaged files are moved aside and the agent
goes on; a state directory it cannot use stops it with exit 2 and one line saying what to do;
writes the operating system refuses are retried until they succeed, losing nothing."""

from __future__ import annotations

import contextlib
import json
import resource
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from simulator import Simulator
from tests.agent_runner import ROOT, AgentProcess, read_jsonl
from tests.contract.agent.test_process import free_port
from tests.unit.agent.test_state_files import a_file, under_proc
from tests.waiting import wait_until
from wire.transports.local import LocalBus

VM = "vm-0"


def add_event(sim: Simulator, event_id: str) -> None:
    response = requests.post(
        f"{sim.base_urls[0]}/_sim/events",
        json={"event_type": "Reboot", "resources": [VM], "event_id": event_id},
        timeout=5,
    )
    assert response.status_code < 300, response.text


def unpublished_rows(state_dir: Path) -> int:
    """Rows of the agent's outbox the bus has not taken yet, read without writing to its database."""
    with contextlib.closing(sqlite3.connect(f"file:{state_dir / 'agent.db'}?mode=ro", uri=True)) as db:
        (count,) = db.execute("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL").fetchone()
    return int(count)


def agent_args(metadata_url: str, state_dir: Path, *extra: str) -> list[str]:
    return ["--cloud", "azure", "--metadata-url", metadata_url, "--vm-name", VM, "--state-dir", str(state_dir),
            "--listen", "off", "--poll-interval", "0.25", *extra]  # fmt: skip


def mbridge_agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mbridge.cli", "agent", *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def test_damaged_state_files_are_moved_aside_and_events_still_reach_the_bus(
    tmp_path: Path, agent_process: Callable[[list[str]], AgentProcess]
) -> None:
    # GIVEN a state directory whose outbox and command ledger are not databases, and an event
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    for name in ("agent.db", "commands.db"):
        (state_dir / name).write_bytes(b"not SQLite at all\n" * 100)
    with Simulator(cloud="azure", vm_names=[VM]) as sim:
        add_event(sim, "E1")

        # WHEN the agent starts on it with the local bus (a command channel: it opens its ledger too)
        agent = agent_process(
            agent_args(sim.base_urls[0], state_dir, "--transport", "local", "--insecure-unsigned-commands")
        )

        # THEN the event reaches the bus, and the agent stops cleanly
        bus = LocalBus(state_dir / "bus.db")
        wait_until(lambda: len(bus.read_events(0)) == 1, 30, agent.log)
        bus.close()
        agent.signal(signal.SIGTERM)
        assert agent.wait() == 0

    # ... each damaged file was moved aside, with one log line naming it, and no traceback anywhere
    log = agent.log()
    for name in ("agent.db", "commands.db"):
        assert len(list(state_dir.glob(f"{name}.corrupt-*"))) == 1
        said = [line for line in log.splitlines() if f"state file {state_dir / name} cannot be used" in line]
        assert len(said) == 1, log
    assert "Traceback" not in log


@pytest.mark.parametrize("place", [a_file, under_proc])
def test_a_state_directory_the_agent_cannot_use_exits_2_with_one_line_saying_what_to_do(
    tmp_path: Path, place: Callable[[Path], Path]
) -> None:
    directory = place(tmp_path)

    done = mbridge_agent(*agent_args(f"http://127.0.0.1:{free_port()}", directory))

    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    message = json.loads(line)["message"]
    assert str(directory) in message
    assert "--state-dir" in message


def check(metadata_url: str, state_dir: Path) -> tuple[int, list[str]]:
    # --vm-name and no proof: three checks in a row would meet the simulator's IMDS rate limit (5/s).
    done = mbridge_agent(
        "--check", "--cloud", "azure", "--metadata-url", metadata_url, "--vm-name", VM, "--state-dir", str(state_dir),
        "--identity-proof", "none", "--listen", "off",  # port 9797 may be taken on a shared machine
    )  # fmt: skip
    return done.returncode, done.stdout.splitlines()


def test_check_tries_the_state_directory(tmp_path: Path) -> None:
    with Simulator(cloud="azure", vm_names=[VM]) as sim:
        # A directory it can write: one ok line for it, and nothing left behind by the check.
        writable = tmp_path / "writable"
        code, lines = check(sim.base_urls[0], writable)
        assert code == 0, lines
        assert any(line.startswith(f"ok      state directory {writable}") for line in lines), lines
        assert list(writable.iterdir()) == []

        # A file where the directory should be: a PROBLEM line naming it, and exit 2 (a configuration
        # error), as the start would refuse it.
        code, lines = check(sim.base_urls[0], a_file(tmp_path))
        assert code == 2
        (problem,) = [line for line in lines if line.startswith("PROBLEM")]
        assert str(tmp_path / "state") in problem
        assert "--state-dir" in problem

        # A damaged outbox: a PROBLEM line naming it and what the agent will do; the file untouched.
        damaged = tmp_path / "damaged"
        damaged.mkdir()
        (damaged / "agent.db").write_bytes(b"not SQLite at all\n")
        code, lines = check(sim.base_urls[0], damaged)
        assert code == 1
        (problem,) = [line for line in lines if line.startswith("PROBLEM")]
        assert f"state file {damaged / 'agent.db'} cannot be used" in problem
        assert "move it aside" in problem
        assert sorted(p.name for p in damaged.iterdir()) == ["agent.db"]


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs prlimit (Linux)")
@pytest.mark.slow
def test_writes_the_system_refuses_are_retried_until_they_succeed_losing_nothing(
    tmp_path: Path, agent_process: Callable[[list[str]], AgentProcess]
) -> None:
    # The closest to a full disk a test gets without root: RLIMIT_FSIZE, set on the running agent,
    # makes the kernel refuse to grow its files (EFBIG; SQLite reports an I/O error, where a full
    # disk gives SQLITE_FULL: that one is in tests/unit/agent/test_loop.py).
    state_dir = tmp_path / "state"
    events = tmp_path / "events.jsonl"
    with Simulator(cloud="azure", vm_names=[VM]) as sim:
        add_event(sim, "E1")
        agent = agent_process(agent_args(sim.base_urls[0], state_dir, "--jsonl-path", str(events)))
        wait_until(lambda: len(read_jsonl(events)) == 1, 30, agent.log)
        # ... and marked published: a limit set before that write would make the agent publish E1
        # again (at least once, as it must), and the count below would see the repeat
        wait_until(lambda: unpublished_rows(state_dir) == 0, 30, agent.log)
        assert agent.process is not None
        pid = agent.process.pid

        # GIVEN an agent whose write-ahead log may not grow by a byte
        limit = (state_dir / "agent.db-wal").stat().st_size
        assert limit > len(agent.log()) + 20_000, "the agent's log must stay below the limit"
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

        # WHEN a new event comes
        add_event(sim, "E2")

        # THEN the agent says it cannot record it and keeps trying, still running
        wait_until(lambda: agent.log().count("cannot record a metadata change yet") >= 2, 30, agent.log)
        assert agent.process.poll() is None
        assert len(read_jsonl(events)) == 1

        # WHEN its files may grow again, THEN the event is published after all
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        wait_until(lambda: len(read_jsonl(events)) == 2, 30, agent.log)
        agent.signal(signal.SIGTERM)
        assert agent.wait() == 0

    assert [(e["data"]["event_id"], e["data"]["status"]) for e in read_jsonl(events)] == [
        ("E1", "scheduled"),
        ("E2", "scheduled"),
    ]
    assert "Traceback" not in agent.log()
