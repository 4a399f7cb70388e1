"""The agent's two databases when their files or their directory fail.

An unusable agent.db or commands.db is moved aside and the agent starts fresh; a state directory
the agent cannot write is a configuration error (exit 2). The full disk is in test_state.py, the
ledger's in tests/unit/test_command_processor.py.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Callable, Protocol

import pytest

from agent.commands import CommandLedger, LedgerError
from agent.config import ConfigError
from agent.state import AgentState


class Database(Protocol):
    def close(self) -> None: ...


OPENERS: dict[str, Callable[[Path], Database]] = {"agent.db": AgentState, "commands.db": CommandLedger}
# A table each database has: the sign that a fresh one was made.
TABLES = {"agent.db": "outbox", "commands.db": "commands"}
# A table of the right name with columns the agent does not know.
WRONG_SCHEMA = {
    "agent.db": "CREATE TABLE outbox (seq INTEGER PRIMARY KEY)",
    "commands.db": "CREATE TABLE commands (command_id TEXT PRIMARY KEY)",
}

skip_for_root = pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads and writes whatever the permissions say"
)


def not_a_database(path: Path) -> None:
    path.write_bytes(b"not SQLite at all\n" * 500)


def truncated(path: Path) -> None:
    """A database cut short after its first page, as a full disk or a bad copy leaves it."""
    OPENERS[path.name](path).close()
    with path.open("r+b") as file:
        file.truncate(4096 + 100)


def wrong_schema(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute(WRONG_SCHEMA[path.name])
    db.close()


def a_directory(path: Path) -> None:
    path.mkdir()


def tables(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        db.close()


def moved_aside(directory: Path, name: str) -> list[Path]:
    return sorted(
        p for p in directory.iterdir() if re.fullmatch(rf"{re.escape(name)}\.corrupt-\d{{8}}T\d{{6}}Z", p.name)
    )


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


@pytest.mark.parametrize("damage", [not_a_database, truncated, wrong_schema, a_directory])
@pytest.mark.parametrize("name", OPENERS)
def test_an_unusable_database_is_moved_aside_and_a_fresh_one_is_made(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, damage: Callable[[Path], None]
) -> None:
    # GIVEN a state file damaged that way
    path = tmp_path / name
    damage(path)

    # WHEN the agent opens it
    OPENERS[name](path).close()

    # THEN the damaged file is kept under a timestamped name, a fresh database took its place,
    # and one log line said which file, where it went and what happens now
    (aside,) = moved_aside(tmp_path, name)
    assert TABLES[name] in tables(path)
    (line,) = warnings(caplog)
    assert str(path) in line
    assert aside.name in line
    assert "fresh" in line


@pytest.mark.parametrize("name", OPENERS)
def test_its_wal_and_shm_files_go_with_it(tmp_path: Path, name: str) -> None:
    # GIVEN a damaged database with the write-ahead log and shared-memory files of its last writer
    path = tmp_path / name
    not_a_database(path)
    Path(f"{path}-wal").write_bytes(b"old log")
    Path(f"{path}-shm").write_bytes(b"old index")

    # WHEN the agent opens it
    OPENERS[name](path).close()

    # THEN they sit beside the moved file under its new name (so the three still open together),
    # the log as it was (the -shm file is only an index of it, which SQLite rewrites at will), and
    # the fresh database never sees the old log
    (aside,) = moved_aside(tmp_path, name)
    assert Path(f"{aside}-wal").read_bytes() == b"old log"
    assert Path(f"{aside}-shm").exists()
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").read_bytes() != b"old log"


@skip_for_root
@pytest.mark.parametrize("name", OPENERS)
def test_a_file_the_agent_cannot_read_is_moved_aside(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    OPENERS[name](path).close()
    path.chmod(0)

    OPENERS[name](path).close()

    assert len(moved_aside(tmp_path, name)) == 1
    assert TABLES[name] in tables(path)


@pytest.mark.parametrize("name", OPENERS)
def test_a_good_database_is_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str) -> None:
    path = tmp_path / name
    OPENERS[name](path).close()

    OPENERS[name](path).close()

    assert moved_aside(tmp_path, name) == []
    assert warnings(caplog) == []


def test_a_ledger_from_a_newer_agent_is_refused_not_moved_aside(tmp_path: Path) -> None:
    # A newer ledger is not damaged: the agent was downgraded, and its replay protection is in there.
    path = tmp_path / "commands.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()

    with pytest.raises(LedgerError, match="upgrade maintenance-bridge"):
        CommandLedger(path)
    assert moved_aside(tmp_path, "commands.db") == []


def a_file(tmp_path: Path) -> Path:
    (tmp_path / "state").write_text("")
    return tmp_path / "state"


def under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "file").write_text("")
    return tmp_path / "file" / "state"


def under_proc(tmp_path: Path) -> Path:
    return Path("/proc/mbridge-state")


def read_only(tmp_path: Path) -> Path:
    (tmp_path / "state").mkdir(mode=0o500)
    return tmp_path / "state"


def under_read_only(tmp_path: Path) -> Path:
    (tmp_path / "locked").mkdir(mode=0o500)
    return tmp_path / "locked" / "state"


@pytest.mark.parametrize(
    "place",
    [
        a_file,
        under_a_file,
        pytest.param(under_proc, marks=pytest.mark.skipif(not Path("/proc/self").exists(), reason="no /proc")),
        pytest.param(read_only, marks=skip_for_root),
        pytest.param(under_read_only, marks=skip_for_root),
    ],
)
@pytest.mark.parametrize("name", OPENERS)
def test_a_state_directory_the_agent_cannot_write_is_a_configuration_error(
    tmp_path: Path, name: str, place: Callable[[Path], Path]
) -> None:
    directory = place(tmp_path)

    with pytest.raises(ConfigError) as raised:
        OPENERS[name](directory / name)

    # The message names the directory and what to do about it.
    assert str(directory) in str(raised.value)
    assert "--state-dir" in str(raised.value)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="for root only (where the permission cases skip), and it needs unshare from util-linux",
)
def test_the_permission_cases_hold_for_an_agent_that_is_not_root() -> None:
    # GIVEN the cases that skip as root (root reads and writes whatever the permissions say), run again
    # as an unprivileged user of a user namespace, as the agent's service account would run them
    selected = "cannot_read or cannot_write"
    done = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", sys.executable, "-m", "pytest", "-q",
         "-p", "no:cacheprovider", str(Path(__file__)), "-k", selected],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3], timeout=120, check=False,
    )  # fmt: skip

    # THEN every one of them passes there, none skipped
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]
    assert "passed" in summary
    assert "skipped" not in summary, summary
