"""The README's demo command, run as a user would (through the interpreter of the venv)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_sees_every_documented_step_and_exits_zero() -> None:
    # WHEN the demo runs to its end
    finished = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=ROOT,
    )

    # THEN it passed and showed the documented Azure sequence and the GCE long-poll
    assert finished.returncode == 0, finished.stdout + finished.stderr
    out = finished.stdout
    for incarnation in (1, 2, 3, 4):
        assert f"incarnation {incarnation}:" in out
    assert "C7061BAC-AFDC-4513-B24B-AA5F13A16123 Freeze Scheduled" in out
    assert "C7061BAC-AFDC-4513-B24B-AA5F13A16123 Freeze Started" in out
    assert "approved C7061BAC-AFDC-4513-B24B-AA5F13A16123: HTTP 200" in out
    assert "maintenance-event = MIGRATE_ON_HOST_MAINTENANCE" in out
    assert "every documented step was seen: OK" in out


def test_cli_lists_its_commands() -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "agent.cli", "--help"], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert finished.returncode == 0
    assert "simulate" in finished.stdout


def test_the_agent_command_loads_neither_the_simulator_nor_the_function_stores() -> None:
    # GIVEN `mbridge agent --help` run with import tracing
    finished = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "agent.cli", "agent", "--help"],
        capture_output=True, text=True, timeout=30, cwd=ROOT,
    )  # fmt: skip
    # THEN its flags are shown and the modules of the other commands were never imported
    assert finished.returncode == 0
    assert "--metadata-url" in finished.stdout
    imported = finished.stderr
    assert "agent.simulator" not in imported
    assert "functions.local_app" not in imported
