"""The Azurite Table service, started by the test suite (see tests/peers.py for the rules).

Azurite comes from npm into the repository's node_modules (`npm install --no-save
azurite@3.35.0`; 3.35 runs on Node 20). It runs on a free loopback port with its data in a
temporary directory, and the fixture yields a connection string with Azurite's well-known
development account, which the azure-data-tables client takes as it is.

This module must import on the plain Python 3.9 of the compatibility run: standard library and
pytest only.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.peers import PeerProcess, free_port, log_tail, require_peer, start_peer

REPO_ROOT = Path(__file__).resolve().parent.parent
AZURITE_TABLE = REPO_ROOT / "node_modules" / ".bin" / "azurite-table"
INSTALL_HINT = "cd the repository root and run `npm install --no-save azurite@3.35.0`"
READY_TEXT = "successfully started"
LISTEN_TIMEOUT = 10.0

# Azurite's fixed development account (public, documented; it guards nothing).
ACCOUNT_NAME = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def connection_string(port: int) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};AccountKey={ACCOUNT_KEY};"
        f"TableEndpoint=http://127.0.0.1:{port}/{ACCOUNT_NAME};"
    )


def start_azurite_tables(workspace: Path) -> tuple[PeerProcess, int]:
    """Start the Azurite Table service on a free loopback port (skip/fail when it is missing)."""
    require_peer(AZURITE_TABLE.exists(), f"Azurite is not installed in {REPO_ROOT / 'node_modules'}: {INSTALL_HINT}")
    require_peer(shutil.which("node") is not None, f"node is not on PATH: Azurite needs Node.js 20 ({INSTALL_HINT})")
    port = free_port()
    command = [
        str(AZURITE_TABLE),
        "--tableHost",
        "127.0.0.1",
        "--tablePort",
        str(port),
        "--location",
        str(workspace / "data"),
        "--skipApiVersionCheck",  # the SDK may speak a newer API version than this Azurite knows
        "--loose",
        "--disableTelemetry",
    ]
    peer = start_peer("azurite-table", command, f"127.0.0.1:{port}", READY_TEXT, workspace)
    _wait_listening(peer, port)
    return peer, port


def _wait_listening(peer: PeerProcess, port: int) -> None:
    """The ready line comes as the server binds; connect once to be sure it accepts."""
    deadline = time.monotonic() + LISTEN_TIMEOUT
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                peer.stop()
                pytest.fail(
                    f"azurite-table printed {READY_TEXT!r} but does not accept connections on port {port}; "
                    f"log tail:\n{log_tail(peer.log_path)}"
                )
            time.sleep(0.05)


@pytest.fixture(scope="session")
def azurite_tables(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Azurite Table service for the whole session; yields its connection string."""
    peer, port = start_azurite_tables(tmp_path_factory.mktemp("azurite"))
    try:
        yield connection_string(port)
    finally:
        peer.stop()
