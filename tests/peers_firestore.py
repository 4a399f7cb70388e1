"""Google's Firestore emulator, started by the test suite (see tests/peers.py for the rules).

Registered for every test by `pytest_plugins` in tests/conftest.py. Standard library and pytest
only: this module is imported on the plain Python 3.9 of the compatibility run too.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.peers import PeerProcess, free_port, gcloud_sdk_root, require_peer, start_peer

EMULATOR_VARIABLE = "FIRESTORE_EMULATOR_HOST"
READY_TEXT = "API endpoint"


def start_firestore_emulator(log_dir: Path) -> PeerProcess:
    """Start Google's Firestore emulator on a free loopback port (skip/fail when it is missing)."""
    sdk_root = gcloud_sdk_root()
    require_peer(sdk_root is not None, "the Google Cloud CLI (gcloud) is not installed: no Firestore emulator")
    assert sdk_root is not None
    emulator = sdk_root / "platform" / "cloud-firestore-emulator" / "cloud_firestore_emulator"
    require_peer(
        os.access(emulator, os.X_OK),
        f"the Firestore emulator is not installed at {emulator} (gcloud components install cloud-firestore-emulator)",
    )
    require_peer(shutil.which("java") is not None, "java is not on PATH: the Firestore emulator needs Java 17")
    port = free_port()
    command = [str(emulator), "--host=127.0.0.1", f"--port={port}"]
    return start_peer("firestore-emulator", command, f"127.0.0.1:{port}", READY_TEXT, log_dir)


@pytest.fixture(scope="session")
def firestore_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Firestore emulator for the whole session; yields its "127.0.0.1:PORT" and points
    FIRESTORE_EMULATOR_HOST at it (restored at the end), so the client library uses it.

    Tests isolate their data by using a project id of their own (the emulator keeps each
    project's documents apart)."""
    peer = start_firestore_emulator(tmp_path_factory.mktemp("firestore-emulator"))
    previous = os.environ.get(EMULATOR_VARIABLE)
    os.environ[EMULATOR_VARIABLE] = peer.host
    try:
        yield peer.host
    finally:
        if previous is None:
            os.environ.pop(EMULATOR_VARIABLE, None)
        else:
            os.environ[EMULATOR_VARIABLE] = previous
        peer.stop()
