"""The commands the demo prints for the reader to run work as printed: after `make demo` the
`mbridge` of `.venv-demo` is not on the PATH, so a bare `mbridge audit list` was not found."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from functions.core.ports import AuditRecord
from functions.local_app.store import SqliteStore
from mbridge.demo import pubsub_function
from mbridge.demo.errors import DemoSetupError
from mbridge.demo.world import audit_hint, mbridge_command

ROOT = Path(__file__).resolve().parents[3]


def an_environment(tmp_path: Path, *, script: bool) -> Path:
    """A virtualenv's bin directory, with or without its `mbridge` script; its python."""
    bin_dir = tmp_path / "my venv" / "bin"
    bin_dir.mkdir(parents=True)
    if script:
        (bin_dir / "mbridge").write_text("#!/bin/sh\n", encoding="utf-8")
        (bin_dir / "mbridge").chmod(0o755)
    return bin_dir / "python"


def test_the_mbridge_beside_the_running_interpreter_is_named_by_its_path(tmp_path: Path) -> None:
    python = an_environment(tmp_path, script=True)

    command = mbridge_command(str(python), which=lambda _name: None)

    assert shlex.split(command) == [str(python.parent / "mbridge")]


def test_the_mbridge_on_the_path_is_named_alone_when_it_is_this_one(tmp_path: Path) -> None:
    python = an_environment(tmp_path, script=True)

    assert mbridge_command(str(python), which=lambda _name: str(python.parent / "mbridge")) == "mbridge"


def test_without_a_script_the_interpreter_runs_the_module(tmp_path: Path) -> None:
    python = an_environment(tmp_path, script=False)

    assert shlex.split(mbridge_command(str(python), which=lambda _name: None)) == [str(python), "-m", "mbridge.cli"]


def test_the_audit_hint_runs_as_printed_with_no_mbridge_on_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN an audit log of one record, in a directory whose name needs quoting
    db = tmp_path / "work dir" / "functions.db"
    db.parent.mkdir()
    store = SqliteStore(db)
    when = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
    store.append(AuditRecord(when, "decision", "envelope-1", "E1", "web-0", status="scheduled", reason="shown"))
    store.close()

    # WHEN the demo runs with only the system on the PATH (`make demo`), and what it prints is run
    # as printed from another directory
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    hint = audit_hint(db)
    (command,) = [part.strip() for part in hint.split("`") if "audit list" in part]
    done = subprocess.run(
        shlex.split(command), capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env=dict(os.environ),
    )  # fmt: skip

    # THEN it prints the record
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["reason"] for line in done.stdout.splitlines()] == ["shown"]


def test_the_missing_google_libraries_are_installed_into_the_running_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `pip` alone is whichever pip the shell finds first, not the one of `.venv-demo/bin/mbridge`.
    monkeypatch.setattr(pubsub_function, "_missing", lambda module: module == "functions_framework")

    with pytest.raises(DemoSetupError) as refused:
        pubsub_function.require_google_libraries(ROOT)

    message = str(refused.value)
    assert f"{shlex.quote(sys.executable)} -m pip install -e {shlex.quote(str(ROOT) + '[functions-gcp]')}" in message
    assert "make venv" in message
