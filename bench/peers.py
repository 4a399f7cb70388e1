"""The real local peers the function benchmarks run against: Azurite's Table service and Google's
Firestore emulator, started on free loopback ports with their data in the bench's work directory;
and Google's Pub/Sub emulator, for what the bus itself does (bench/ordering_flood.py).

Starting and stopping is the demo's own code (mbridge/demo/emulators.py: a process
group per peer, its output in a log file, the whole group stopped at the end). A peer that is not
installed or does not start raises `PeerUnavailableError` saying why; the section then reports
its figures as not measured, with that reason.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.results import ROOT
from mbridge.demo.emulators import (
    FIRESTORE,
    PUBSUB,
    PeerProcess,
    accepts_connections,
    free_port,
    launch,
    start_emulator,
    wait_ready,
)
from mbridge.demo.errors import DemoSetupError

AZURITE_TABLE = ROOT / "node_modules" / ".bin" / "azurite-table"
AZURITE_HINT = "run `npm install --no-save azurite@3.35.0` in the repository root"
AZURITE_READY = "successfully started"
# Azurite's fixed development account: public and documented, it guards nothing.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class PeerUnavailableError(Exception):
    """A peer is not installed here or did not start; the message says which and why."""


def azurite_connection_string(port: int) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"TableEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
    )


def start_azurite_tables(workdir: Path) -> tuple[PeerProcess, str]:
    """Azurite's Table service on a free port; returns it and its connection string.

    Raises:
        PeerUnavailableError: Azurite or node is missing, or it did not start.
    """
    if not AZURITE_TABLE.exists():
        raise PeerUnavailableError(f"Azurite is not installed in {AZURITE_TABLE.parent.parent}: {AZURITE_HINT}")
    if shutil.which("node") is None:
        raise PeerUnavailableError(f"node is not on PATH: Azurite needs Node.js 20 ({AZURITE_HINT})")
    port = free_port()
    command = [
        str(AZURITE_TABLE), "--tableHost", "127.0.0.1", "--tablePort", str(port),
        "--location", str(workdir / "azurite-data"),
        "--skipApiVersionCheck",  # the SDK may speak a newer API version than this Azurite knows
        "--loose", "--disableTelemetry",
    ]  # fmt: skip
    try:
        peer = launch("azurite-table", command, f"127.0.0.1:{port}", workdir)
        wait_ready(peer, AZURITE_READY)
        wait_ready(peer, accepts_connections(peer.host))
    except DemoSetupError as exc:
        raise PeerUnavailableError(f"Azurite did not start: {exc}") from exc
    return peer, azurite_connection_string(port)


def start_firestore_emulator(workdir: Path) -> PeerProcess:
    """Google's Firestore emulator on a free port (point FIRESTORE_EMULATOR_HOST at its `host`).

    Raises:
        PeerUnavailableError: gcloud, the emulator component or Java is missing, or it did not start.
    """
    try:
        return start_emulator(FIRESTORE, workdir)
    except DemoSetupError as exc:
        raise PeerUnavailableError(f"the Firestore emulator is not available: {exc}") from exc


def start_pubsub_emulator(workdir: Path) -> PeerProcess:
    """Google's Pub/Sub emulator on a free port (point PUBSUB_EMULATOR_HOST at its `host`).

    Raises:
        PeerUnavailableError: gcloud, the emulator component or Java is missing, or it did not start.
    """
    try:
        return start_emulator(PUBSUB, workdir)
    except DemoSetupError as exc:
        raise PeerUnavailableError(f"the Pub/Sub emulator is not available: {exc}") from exc


@contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for the block (the Google clients read the emulator hosts from it)."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous
