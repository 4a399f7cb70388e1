"""Google's Firestore emulator, started by the test suite (see tests/peers.py for the rules).

Registered for every test by `pytest_plugins` in tests/conftest.py. Standard library, pytest and the
demo's emulator starter only: this module is imported on the plain Python 3.9 of the
compatibility run too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mbridge.demo.emulators import FIRESTORE
from tests.peers import PeerProcess, start_emulator

EMULATOR_VARIABLE = FIRESTORE.variable


def start_firestore_emulator(log_dir: Path) -> PeerProcess:
    """Start Google's Firestore emulator on a free loopback port (skip/fail when it is missing)."""
    return start_emulator(FIRESTORE, log_dir)


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
