"""Real local peers the test suite starts itself (design §6): Google's emulators, later Azurite.

Registered for every test by `pytest_plugins` in tests/conftest.py. A peer that is missing skips
the tests that need it when run by hand, and fails them under CI (CI=true): a peer test that
silently skips in CI would hide a broken install step.

This module must import on the plain Python 3.9 of the compatibility run: standard library and
pytest only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

STARTUP_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
LOG_TAIL_LINES = 30


def require_peer(condition: bool, reason: str) -> None:
    """Go on when `condition` holds; otherwise skip the test (by hand) or fail it (CI=true)."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the image must provide this peer)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now (the emulators take no port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def gcloud_sdk_root() -> Path | None:
    """The Google Cloud CLI's SDK root (`platform/` holds the emulators), or None without gcloud."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        return None
    try:
        completed = subprocess.run(
            [gcloud, "info", "--format=value(installation.sdk_root)"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    root = completed.stdout.strip()
    return Path(root) if completed.returncode == 0 and root else None


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


@dataclass
class PeerProcess:
    """A peer running in its own process group, its output going to `log_path`."""

    name: str
    host: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def stop(self) -> None:
        """Stop the whole process group (the emulator scripts start a JVM as a child)."""
        if self.process.poll() is not None:
            return
        _signal_group(self.process, signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            _signal_group(self.process, signal.SIGKILL)
            self.process.wait(timeout=STOP_TIMEOUT)


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already gone
        os.killpg(process.pid, signum)  # the group id is the pid: started with start_new_session


def start_peer(name: str, command: list[str], host: str, ready_text: str, log_dir: Path) -> PeerProcess:
    """Start `command` in a new process group and wait until its output shows `ready_text`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    peer = PeerProcess(name=name, host=host, process=process, log_path=log_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while ready_text not in log_path.read_text(encoding="utf-8", errors="replace"):
        if process.poll() is not None:
            pytest.fail(f"{name} exited with {process.returncode} before it was ready; log tail:\n{log_tail(log_path)}")
        if time.monotonic() > deadline:
            peer.stop()
            pytest.fail(
                f"{name} did not print {ready_text!r} within {STARTUP_TIMEOUT:.0f} s; log tail:\n{log_tail(log_path)}"
            )
        time.sleep(0.1)
    return peer


def start_pubsub_emulator(log_dir: Path) -> PeerProcess:
    """Start Google's Pub/Sub emulator on a free loopback port (skip/fail when it is missing)."""
    sdk_root = gcloud_sdk_root()
    require_peer(sdk_root is not None, "the Google Cloud CLI (gcloud) is not installed: no Pub/Sub emulator")
    assert sdk_root is not None
    emulator = sdk_root / "platform" / "pubsub-emulator" / "bin" / "cloud-pubsub-emulator"
    require_peer(
        os.access(emulator, os.X_OK),
        f"the Pub/Sub emulator is not installed at {emulator} (gcloud components install pubsub-emulator)",
    )
    require_peer(shutil.which("java") is not None, "java is not on PATH: the Pub/Sub emulator needs Java 17")
    host = f"127.0.0.1:{free_port()}"
    port = host.rsplit(":", 1)[1]
    command = [str(emulator), "--host=127.0.0.1", f"--port={port}"]
    return start_peer("pubsub-emulator", command, host, "Server started", log_dir)


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
