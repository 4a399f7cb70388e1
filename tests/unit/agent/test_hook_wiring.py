"""`mbridge agent --hook-command`: the hook runs for each change of this VM's maintenance, seen over
HTTP by a real agent, and for nothing else; a hook setting it cannot use stops the agent at once."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import requests

from simulator import Simulator
from tests.agent_runner import AgentThread, settings_for
from tests.waiting import wait_until

VM = "vm-0"
OWN_EVENT = "1B2B3C4D-0000-4000-8000-00000000A001"
OTHER_EVENT = "1B2B3C4D-0000-4000-8000-00000000B002"
ROOT = Path(__file__).resolve().parents[3]


def recording_hook(tmp_path: Path) -> tuple[Path, Path]:
    """A hook script that appends `<event id> <status> <vm>` for each run."""
    record = tmp_path / "hook-runs.txt"
    script = tmp_path / "hook.sh"
    script.write_text(
        f'#!/bin/sh\necho "$MBRIDGE_EVENT_ID $MBRIDGE_EVENT_STATUS $MBRIDGE_EVENT_VM" >> "{record}"\n',
        encoding="utf-8",
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, record


def runs(record: Path) -> list[str]:
    return record.read_text(encoding="utf-8").splitlines() if record.exists() else []


def test_the_hook_runs_for_this_vms_maintenance_only(tmp_path: Path, agent_thread: Callable[..., AgentThread]) -> None:
    script, record = recording_hook(tmp_path)
    with Simulator(cloud="azure", vm_names=[VM]) as sim:
        # GIVEN a running agent with a hook command
        settings = settings_for(
            "azure", sim.base_urls[0], VM, tmp_path / "state", identity_proof="none", hook_command=str(script)
        )
        agent = agent_thread(settings)
        # WHEN an event of another VM and then one of this VM are scheduled
        for event_id, resources in ((OTHER_EVENT, ["vm-9"]), (OWN_EVENT, [VM])):
            requests.post(
                f"{sim.base_urls[0]}/_sim/events",
                json={"event_type": "Freeze", "event_id": event_id, "resources": resources},
                timeout=5,
            ).raise_for_status()
        agent.wait_for_count(1)
        # THEN the hook runs once, for this VM's event, with the event in its environment
        wait_until(lambda: bool(runs(record)), 10.0, lambda: "a hook run")
        assert runs(record) == [f"{OWN_EVENT} scheduled {VM}"]


def agent_cli(tmp_path: Path, **environ: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MBRIDGE_")}
    env.update({"MBRIDGE_CLOUD": "azure", "MBRIDGE_STATE_DIR": str(tmp_path), "MBRIDGE_LISTEN": "off", **environ})
    return subprocess.run(
        [sys.executable, "-m", "mbridge.cli", "agent", "--metadata-url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )


def test_a_hook_command_it_cannot_run_is_one_configuration_error(tmp_path: Path) -> None:
    # GIVEN a command line with an unclosed quote, and a timeout of nothing
    for environ, named in (
        ({"MBRIDGE_HOOK_COMMAND": "/usr/local/bin/notify 'unclosed"}, "MBRIDGE_HOOK_COMMAND"),
        ({"MBRIDGE_HOOK_COMMAND": "/bin/true", "MBRIDGE_HOOK_TIMEOUT": "0"}, "MBRIDGE_HOOK_TIMEOUT"),
    ):
        # WHEN the agent starts THEN it stops at once: one line naming the setting, exit 2
        finished = agent_cli(tmp_path, **environ)
        assert finished.returncode == 2, finished.stderr
        lines = finished.stderr.strip().splitlines()
        assert len(lines) == 1, finished.stderr
        assert lines[0].startswith("mbridge agent: ")
        assert named in lines[0]
