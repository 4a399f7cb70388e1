"""The local function host of the end-to-end tests, as deployed: it verifies the agents' proofs
with the simulator's trust and signs its commands; a default policy but a 1 s drain period."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import requests

from agent.config import AgentSettings
from functions.core.policy import Policy
from functions.local_app.balancer import LocalPool
from functions.local_app.host import LocalFunctionHost
from functions.local_app.store import SqliteStore
from functions.trust.trust_file import verifier_from_trust
from mbridge.demo.world import CommandKeys
from simulator import Simulator
from tests.agent_runner import settings_for
from wire.transports.local import LocalBus


@dataclass(frozen=True)
class Deployment:
    """What the host and the agents share in `directory`: the embedded bus, the pool of the VMs, the
    functions' store, and the command keys (the host signs, the agents verify)."""

    directory: Path
    bus_path: Path
    pool: LocalPool
    store: SqliteStore
    keys: CommandKeys

    @classmethod
    def make(cls, directory: Path, vms: Sequence[str]) -> Deployment:
        pool = LocalPool(directory / "pool.db")
        pool.add("web", vms)
        return cls(
            directory, directory / "bus.db", pool, SqliteStore(directory / "functions.db"), CommandKeys.generate()
        )

    def agent(self, url: str, vm: str) -> AgentSettings:
        """The settings of `vm`'s agent on the bus, taking signed commands only."""
        settings = settings_for("azure", url, vm, self.directory / vm)
        return replace(settings, transport="local", bus_path=self.bus_path, verify_key=self.keys.public)


@contextmanager
def running_host(sim: Simulator, deployment: Deployment) -> Iterator[None]:
    """The host consuming the embedded bus in a thread of its own until the block ends."""
    host = LocalFunctionHost(
        LocalBus(deployment.bus_path),
        deployment.store,
        deployment.pool,
        Policy(drain_period_seconds=1.0),
        lambda: datetime.now(timezone.utc),
        verifier=verifier_from_trust(sim.trust()),
        signer=deployment.keys.sign,
    )
    stop = threading.Event()
    runner = threading.Thread(target=host.run, args=(stop,), daemon=True)
    runner.start()
    try:
        yield
    finally:
        stop.set()
        runner.join(timeout=10)


def event_status(sim: Simulator) -> str | None:
    """The status of the simulator's first event, None when it has none."""
    events = requests.get(f"{sim.base_urls[0]}/_sim/events", timeout=5).json()
    return str(events[0]["EventStatus"]) if events else None


def commands_sent(bus_path: Path) -> list[bytes]:
    """Every command the functions put on the embedded bus, settled or not (read only)."""
    db = sqlite3.connect(f"{bus_path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return [bytes(body) for (body,) in db.execute("SELECT body FROM commands ORDER BY seq")]
    finally:
        db.close()
