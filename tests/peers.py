"""Real local peers the test suite starts itself (docs/transports.md#tests): Google's emulators, later Azurite.

Registered for every test by `pytest_plugins` in tests/conftest.py. A peer that is missing skips
the tests that need it when run by hand, and fails them under CI (CI=true): a peer test that
silently skips in CI would hide a broken install step.

This module must import on the plain Python 3.9 of the compatibility run: standard library,
pytest, and the demo's emulator starter (mbridge/demo/emulators.py, standard library
only), which starts and stops the emulators here as it does for `mbridge demo`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mbridge.demo import emulators
from mbridge.demo.emulators import (
    PUBSUB,
    Emulator,
    EmulatorMissingError,
    PeerProcess,
    PeerStartError,
    free_port,
    gcloud_sdk_root,
    log_tail,
)

# Starting and stopping the peers is the demo's own code (mbridge/demo/emulators.py,
# standard library only); these names are what the peer modules of the suite use.
__all__ = ["PeerProcess", "free_port", "gcloud_sdk_root", "log_tail", "require_peer", "start_emulator", "start_peer"]

STARTUP_TIMEOUT = emulators.STARTUP_TIMEOUT


def require_peer(condition: bool, reason: str) -> None:
    """Go on when `condition` holds; otherwise skip the test (by hand) or fail it (CI=true)."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the image must provide this peer)", pytrace=False)
    pytest.skip(reason)


def start_peer(name: str, command: list[str], host: str, ready_text: str, log_dir: Path) -> PeerProcess:
    """Start `command` in a new process group and wait until its output shows `ready_text`
    (the test fails, with the log's tail, when it exits or times out first)."""
    try:
        return emulators.start_peer(name, command, host, ready_text, log_dir, STARTUP_TIMEOUT)
    except PeerStartError as exc:
        pytest.fail(str(exc))


def start_emulator(emulator: Emulator, log_dir: Path) -> PeerProcess:
    """Start one of Google's emulators on a free loopback port (skip/fail when it is missing)."""
    try:
        return emulators.start_emulator(emulator, log_dir)
    except EmulatorMissingError as exc:
        require_peer(False, str(exc))
        raise  # require_peer skipped or failed the test
    except PeerStartError as exc:
        pytest.fail(str(exc))


def start_pubsub_emulator(log_dir: Path) -> PeerProcess:
    """Start Google's Pub/Sub emulator on a free loopback port (skip/fail when it is missing)."""
    return start_emulator(PUBSUB, log_dir)


@pytest.fixture(scope="session")
def pubsub_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Pub/Sub emulator for the whole session; yields its "127.0.0.1:PORT" and points
    PUBSUB_EMULATOR_HOST at it (restored at the end), so the client library uses it."""
    peer = start_pubsub_emulator(tmp_path_factory.mktemp("pubsub-emulator"))
    previous = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = peer.host
    try:
        yield peer.host
    finally:
        if previous is None:
            os.environ.pop("PUBSUB_EMULATOR_HOST", None)
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = previous
        peer.stop()
