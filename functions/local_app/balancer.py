"""A local load-balancer pool: which VMs take traffic, in SQLite. It stands in for an Azure
backend pool or a GCP instance group in the demo and the tests, with the same contract: locate
says where a VM is, remove takes it out of exactly that, restore puts exactly that back."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

from functions.core.ports import JsonObject

SCHEMA = "CREATE TABLE IF NOT EXISTS members (pool TEXT NOT NULL, vm TEXT NOT NULL, PRIMARY KEY (pool, vm));"


class LocalPool:
    def __init__(self, path: Path | str) -> None:
        target = str(path)
        if target != ":memory:":
            Path(target).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(target, timeout=30, check_same_thread=False, isolation_level=None)
        self._db.executescript(SCHEMA)

    def add(self, pool: str, vms: Iterable[str]) -> None:
        with self._lock:
            self._db.executemany("INSERT OR IGNORE INTO members (pool, vm) VALUES (?, ?)", [(pool, vm) for vm in vms])

    def members(self, pool: str) -> list[str]:
        with self._lock:
            rows = self._db.execute("SELECT vm FROM members WHERE pool = ? ORDER BY vm", (pool,)).fetchall()
        return [row[0] for row in rows]

    def locate(self, vm: str) -> JsonObject | None:
        with self._lock:
            pools = [row[0] for row in self._db.execute("SELECT pool FROM members WHERE vm = ? ORDER BY pool", (vm,))]
        return {"pools": pools} if pools else None

    def remove(self, vm: str, memento: JsonObject) -> None:
        with self._lock:
            self._db.executemany(
                "DELETE FROM members WHERE pool = ? AND vm = ?", [(p, vm) for p in memento.get("pools", [])]
            )

    def restore(self, vm: str, memento: JsonObject) -> None:
        self.add_to(memento.get("pools", []), vm)

    def add_to(self, pools: Iterable[str], vm: str) -> None:
        with self._lock:
            self._db.executemany("INSERT OR IGNORE INTO members (pool, vm) VALUES (?, ?)", [(p, vm) for p in pools])

    def close(self) -> None:
        with self._lock:
            self._db.close()
