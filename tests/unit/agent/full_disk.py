"""A database that is full for real, without root or a small file system: SQLite's own page limit.

`PRAGMA max_page_count` caps the pages one connection may give its database. A write that needs
one more page fails inside SQLite exactly as on a full disk (SQLITE_FULL, "database or disk is
full"), and SQLite does to the open transaction what it does on a full disk.
"""

from __future__ import annotations

import sqlite3
from typing import Callable

# SQLite's own default of max_page_count.
NO_PAGE_LIMIT = 1073741823


def no_room_to_grow(db: sqlite3.Connection) -> Callable[[], None]:
    """From now on `db` cannot add a page to its file; returns what makes room again."""
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    db.execute(f"PRAGMA max_page_count = {pages}")

    def make_room() -> None:
        db.execute(f"PRAGMA max_page_count = {NO_PAGE_LIMIT}")

    return make_room


def write_until_it_fails(write: Callable[[int], object], attempts: int = 500) -> Exception:
    """Call write(0), write(1), ... until one raises; returns what it raised."""
    for n in range(attempts):
        try:
            write(n)
        except Exception as exc:
            return exc
    raise AssertionError(f"{attempts} writes and the database still had room")
