"""The `mbridge` entry point: its commands, and what each one imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cli_lists_its_commands() -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "mbridge.cli", "--help"], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert finished.returncode == 0
    assert "simulate" in finished.stdout


def test_the_agent_command_loads_neither_the_simulator_nor_the_function_stores() -> None:
    # GIVEN `mbridge agent --help` run with import tracing
    finished = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mbridge.cli", "agent", "--help"],
        capture_output=True, text=True, timeout=30, cwd=ROOT,
    )  # fmt: skip
    # THEN its flags are shown and the modules of the other commands were never imported
    assert finished.returncode == 0
    assert "--metadata-url" in finished.stdout
    imported = finished.stderr
    assert "simulator" not in imported
    assert "functions.local_app" not in imported
