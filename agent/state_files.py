"""The agent's SQLite files in its state directory: opening them, and what each fault means.

The agent keeps two databases there: agent.db (outbox and source state) and commands.db (the
command ledger). Neither is the only copy of anything that matters for long: the metadata service
shows the current events again, and the bus and the functions deduplicate by envelope id. So a
file the agent cannot use (not SQLite, damaged, another schema, unreadable) is moved aside with a
timestamp and a fresh one made: one log line, and the VM's maintenance keeps being reported
instead of waiting for someone to repair a file. docs/agent.md ("State and its faults") says what
a fresh start may publish again or miss.

Two other faults are not the file's: a state directory the agent cannot write is a configuration
error (StateDirError: exit 2, nothing to retry), and a full disk or an I/O error is transient
(StateUnavailableError: the caller retries, losing nothing).
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from agent.config import ConfigError
from wire.errors import RetryableError

LOGGER = logging.getLogger("mbridge.state")

# SQLite primary result codes (the sqlite3 module names them only from Python 3.11).
SQLITE_ERROR = 1
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_READONLY = 8
SQLITE_IOERR = 10
SQLITE_CORRUPT = 11
SQLITE_FULL = 13
SQLITE_CANTOPEN = 14
SQLITE_FORMAT = 24
SQLITE_NOTADB = 26
# What a file that is not a database of ours answers (SQLITE_ERROR: a statement of ours met a
# schema it does not fit).
_UNUSABLE_FILE = frozenset({SQLITE_ERROR, SQLITE_CORRUPT, SQLITE_FORMAT, SQLITE_NOTADB})
# Python before 3.11 gives only the message: SQLite's own texts for the codes that matter here.
_CODE_OF_MESSAGE = {
    "database is locked": SQLITE_BUSY,
    "database table is locked": SQLITE_LOCKED,
    "attempt to write a readonly database": SQLITE_READONLY,
    "disk I/O error": SQLITE_IOERR,
    "database disk image is malformed": SQLITE_CORRUPT,
    "database or disk is full": SQLITE_FULL,
    "unable to open database file": SQLITE_CANTOPEN,
    "file is not a database": SQLITE_NOTADB,
}
_SIDECARS = ("-wal", "-shm")
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


class StateDirError(ConfigError):
    """The state directory cannot hold the agent's files; the message names it and what to do."""


class StateUnavailableError(RetryableError):
    """Writing the agent's state failed for a reason that may pass (a full disk, an I/O error).
    Nothing was written; the same write may succeed later."""


class _UnusableFile(Exception):
    """A state file the agent cannot use as its database; the message says why."""


def open_database(
    path: Path, *, schema: str, prepare: Callable[[sqlite3.Connection], None] | None = None
) -> sqlite3.Connection:
    """A connection to `path` with `schema` (WAL, synchronous FULL), made in a usable directory.

    `prepare` creates the schema (default: runs it); its own errors pass through. A file that
    cannot be used is moved aside first, and a fresh database made in its place.

    Raises:
        StateDirError: the directory cannot be used (a configuration error).
        StateUnavailableError: a full disk or an I/O error; retry later.
    """
    ensure_state_dir(path.parent)
    problem = _database_problem(path, schema)
    if problem is not None:
        aside = move_aside(path)
        LOGGER.error(
            "state file %s cannot be used (%s): moved it to %s and starting with a fresh one; what a fresh "
            "start publishes again or misses: docs/agent.md, 'State and its faults'",
            path,
            problem,
            aside.name,
        )
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    try:
        with writing(path):
            _set_up(db, schema, prepare)
    except BaseException:
        db.close()
        raise
    return db


def ensure_state_dir(directory: Path) -> None:
    """Make `directory` if needed and prove the agent can create files in it.

    Creating a file proves what os.access cannot: for root, a read-only mount and a writable
    directory look the same to it.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory, prefix=".mbridge-probe-"):
            pass
    except OSError as exc:
        if exc.errno in _NO_ROOM:
            raise StateUnavailableError(f"cannot create files in the state directory {directory}: {exc}") from exc
        raise StateDirError(_directory_advice(directory, exc)) from exc


def move_aside(path: Path) -> Path:
    """Rename `path` to `<name>.corrupt-<UTC time>`, its -wal and -shm files with it; returns the new path.

    The sidecars go first: a fresh database must never find the old write-ahead log beside it,
    which SQLite would replay into it. Under the new name the three still open together.
    """
    aside = _free_name(path.with_name(f"{path.name}.corrupt-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"))
    try:
        for suffix in (*_SIDECARS, ""):
            if os.path.lexists(f"{path}{suffix}"):
                os.replace(f"{path}{suffix}", f"{aside}{suffix}")
    except OSError as exc:
        raise StateDirError(
            f"cannot move the unusable {path} aside ({exc}): let the agent's user rename files in "
            f"{path.parent}, or remove {path} by hand [--state-dir / MBRIDGE_STATE_DIR]"
        ) from exc
    return aside


@contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """Turn a failed write to `path` that may pass (full disk, I/O error, a lock held too long)
    into StateUnavailableError naming the file; other errors (a bug, damage) pass unchanged."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if _error_code(exc) == SQLITE_ERROR:
            raise
        raise StateUnavailableError(f"cannot write {path}: {exc}{_remedy(exc)}") from exc


def state_dir_problems(directory: Path, schemas: Mapping[str, str]) -> list[str]:
    """What keeps the agent from using `directory` and the databases named in `schemas`: a
    database written there for real, then each existing file checked without changing it."""
    try:
        ensure_state_dir(directory)
        _write_a_database(directory)
    except (StateDirError, StateUnavailableError) as exc:
        return [str(exc)]
    except sqlite3.Error as exc:
        return [f"SQLite cannot write a database in the state directory {directory}: {exc}"]
    problems = []
    for name, schema in schemas.items():
        problem = _database_problem(directory / name, schema)
        if problem is not None:
            problems.append(
                f"state file {directory / name} cannot be used ({problem}); the agent will move it aside and "
                "start with a fresh one"
            )
    return problems


def _database_problem(path: Path, schema: str) -> str | None:
    """Why `path` cannot serve as the database of `schema`, or None; changes nothing.

    Read-only: a read-write connection deletes the -wal and -shm files it found when it closes,
    and they belong with the file when it is moved aside. Errors that may pass (a lock) are not
    the file's fault: None, and opening it for real meets them again.
    """
    problem = _access_problem(path)
    if problem is not None or not path.exists():
        return problem
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        _require_intact(db)
        _require_columns(db, schema)
    except sqlite3.Error as exc:
        return str(exc) if _error_code(exc) in _UNUSABLE_FILE else None
    except _UnusableFile as exc:
        return str(exc)
    finally:
        db.close()
    return None


def _set_up(db: sqlite3.Connection, schema: str, prepare: Callable[[sqlite3.Connection], None] | None) -> None:
    db.execute("PRAGMA busy_timeout=5000")
    db.execute("PRAGMA journal_mode=WAL")
    # FULL: what the agent calls written survives power loss, not only a process crash (an
    # outbox row; a command marked "executing" before its approval is POSTed).
    db.execute("PRAGMA synchronous=FULL")
    if prepare is None:
        db.executescript(schema)
    else:
        prepare(db)


def _access_problem(path: Path) -> str | None:
    for file in (path, *(Path(f"{path}{suffix}") for suffix in _SIDECARS)):
        if not os.path.lexists(file):
            continue
        if not file.is_file():
            return f"{file.name} is not a regular file"
        if not os.access(file, os.R_OK | os.W_OK):
            return f"the agent's user cannot read and write {file.name}"
    return None


def _require_intact(db: sqlite3.Connection) -> None:
    # quick_check reads every page (the state files are small) but skips the slow index checks.
    rows = db.execute("PRAGMA quick_check").fetchall()
    if rows != [("ok",)]:
        raise _UnusableFile("damaged: " + "; ".join(str(row[0]) for row in rows[:3]))


def _require_columns(db: sqlite3.Connection, schema: str) -> None:
    """Every column `schema` defines must be there; tables and columns beyond them do no harm."""
    for table, expected in _columns(schema).items():
        present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        missing = [column for column in expected if column not in present]
        if present and missing:
            raise _UnusableFile(f"table {table} has another schema (no column {', '.join(missing)})")


def _columns(schema: str) -> dict[str, list[str]]:
    # Read from the schema itself, so the check can never disagree with what the agent creates.
    reference = sqlite3.connect(":memory:")
    try:
        reference.executescript(schema)
        names = [name for (name,) in reference.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            name: [row[1] for row in reference.execute(f"PRAGMA table_info({name})")]
            for name in names
            if not name.startswith("sqlite_")
        }
    finally:
        reference.close()


def _write_a_database(directory: Path) -> None:
    """Create, write and delete a WAL database in `directory`, as the agent's own would be."""
    handle, name = tempfile.mkstemp(dir=directory, prefix=".mbridge-check-", suffix=".db")
    os.close(handle)
    try:
        db = sqlite3.connect(name, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE probe (value TEXT)")
            db.execute("INSERT INTO probe VALUES ('written')")
        finally:
            db.close()
    finally:
        for suffix in ("", *_SIDECARS):
            Path(f"{name}{suffix}").unlink(missing_ok=True)


def _error_code(exc: sqlite3.Error) -> int:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF  # the primary code of an extended one
    known = _CODE_OF_MESSAGE.get(str(exc))
    if known is not None:
        return known
    # Python before 3.11, another message: sqlite3 raises OperationalError for SQLITE_ERROR and
    # the transient codes, plain DatabaseError for damage.
    return SQLITE_ERROR if isinstance(exc, sqlite3.OperationalError) else SQLITE_CORRUPT


def _remedy(exc: sqlite3.Error) -> str:
    if _error_code(exc) == SQLITE_FULL:
        return "; free space on its file system, the agent retries on its own"
    return "; the agent retries on its own"


def _directory_advice(directory: Path, exc: OSError) -> str:
    if directory.exists() and not directory.is_dir():
        what = "is a file, not a directory"
    else:
        what = f"cannot be used: {exc.strerror or exc}"
    return (
        f"the state directory {directory} {what}. Give the agent a directory its user can create files in "
        "(the systemd unit's StateDirectory= makes /var/lib/mbridge), or choose another with --state-dir "
        "[MBRIDGE_STATE_DIR]"
    )


def _free_name(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`... when two files are moved aside within one second."""
    candidate, number = path, 1
    while any(os.path.lexists(f"{candidate}{suffix}") for suffix in ("", *_SIDECARS)):
        number += 1
        candidate = path.with_name(f"{path.name}-{number}")
    return candidate
