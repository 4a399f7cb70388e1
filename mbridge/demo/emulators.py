"""Google's local emulators (Pub/Sub, Firestore) and the other helper processes of the demo.

Each process runs in a process group of its own (the emulator scripts start a JVM as a child,
the functions framework forks a gunicorn worker), with its output in a log file; `stop()` ends
the whole group. A process that does not become ready is stopped before the error is raised, so
a start that fails half way leaves nothing behind.

The emulators come with the Google Cloud CLI: the SDK root is `$CLOUDSDK_ROOT_DIR` when set,
else what `gcloud info` reports. What is missing (gcloud, an emulator component, Java) raises
`EmulatorMissingError` saying how to get it.

Standard library only: tests/peers.py starts the suite's emulators with this module, on the
plain Python 3.9 of the compatibility run too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

from mbridge.demo.errors import DemoSetupError

STARTUP_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
LOG_TAIL_LINES = 30
PROGRESS_EVERY = 5.0  # seconds between "still waiting" words while a peer starts
SDK_ROOT_VARIABLE = "CLOUDSDK_ROOT_DIR"
INSTALL_HINT = "gcloud components install pubsub-emulator cloud-firestore-emulator"
JAVA_HINT = "the emulators need Java 17 or newer on PATH (or JAVA_HOME), e.g. apt-get install openjdk-17-jre-headless"

# Ready when this text is in the log, or when the callable says so.
Readiness = Union[str, Callable[[], bool]]


class EmulatorMissingError(DemoSetupError):
    """gcloud, an emulator component or Java is not installed; the message says how to get it."""


class PeerStartError(DemoSetupError):
    """A process was started but did not become ready; the message holds its log's tail."""


@dataclass(frozen=True)
class Emulator:
    name: str  # also the log file's name
    label: str
    component: str  # the gcloud component that installs it
    apt_package: str  # the same for gcloud installed from Google's apt repository
    path: str  # the launcher, relative to the SDK root
    ready_text: str
    variable: str  # what the client libraries read to use it


PUBSUB = Emulator(
    name="pubsub-emulator",
    label="Pub/Sub",
    component="pubsub-emulator",
    apt_package="google-cloud-cli-pubsub-emulator",
    path="platform/pubsub-emulator/bin/cloud-pubsub-emulator",
    ready_text="Server started",
    variable="PUBSUB_EMULATOR_HOST",
)
FIRESTORE = Emulator(
    name="firestore-emulator",
    label="Firestore",
    component="cloud-firestore-emulator",
    apt_package="google-cloud-cli-firestore-emulator",
    path="platform/cloud-firestore-emulator/cloud_firestore_emulator",
    ready_text="API endpoint",
    variable="FIRESTORE_EMULATOR_HOST",
)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now (the emulators take no port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def gcloud_sdk_root() -> Path | None:
    """The Google Cloud CLI's SDK root (`platform/` holds the emulators): $CLOUDSDK_ROOT_DIR when
    set, else what `gcloud info` says; None without gcloud."""
    configured = os.environ.get(SDK_ROOT_VARIABLE, "").strip()
    if configured:
        return Path(configured)
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        return None
    try:
        completed = subprocess.run(  # noqa: S603  # gcloud as found on PATH, fixed arguments
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


def java_available() -> bool:
    """What the emulator scripts run: $JAVA_HOME/bin/java when JAVA_HOME is set, else java on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return os.access(Path(home) / "bin" / "java", os.X_OK)
    return shutil.which("java") is not None


def emulator_launcher(emulator: Emulator, sdk_root: Path | None = None) -> Path:
    """The emulator's launcher script, after checking that it and Java are installed.

    Raises:
        EmulatorMissingError: saying what is missing and how to get it.
    """
    root = sdk_root or gcloud_sdk_root()
    if root is None:
        raise EmulatorMissingError(
            f"the Google Cloud CLI (gcloud) is not installed, so there is no {emulator.label} emulator: install it "
            f"(https://cloud.google.com/sdk/docs/install), then `{INSTALL_HINT}`; {JAVA_HINT}"
        )
    launcher = root / emulator.path
    if not os.access(launcher, os.X_OK):
        raise EmulatorMissingError(
            f"the {emulator.label} emulator is not installed at {launcher}: `{INSTALL_HINT}` "
            f"(gcloud from apt: apt-get install {emulator.apt_package}); {JAVA_HINT}"
        )
    if not java_available():
        raise EmulatorMissingError(f"java was not found: {JAVA_HINT}")
    return launcher


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


@dataclass
class PeerProcess:
    """A process running in its own process group, its output going to `log_path`."""

    name: str
    host: str  # "127.0.0.1:PORT"
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL if it does not end in time."""
        if self.process.poll() is None:
            _signal_group(self.process, signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                _signal_group(self.process, signal.SIGKILL)
                self.process.wait(timeout=STOP_TIMEOUT)
        # The leader is gone; a child that ignored SIGTERM (a JVM busy shutting down) goes now.
        _signal_group(self.process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
        os.killpg(process.pid, signum)  # the group id is the pid: started with start_new_session


def launch(
    name: str,
    command: Sequence[str],
    host: str,
    log_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> PeerProcess:
    """Start `command` in a new process group, its output in `log_dir/<name>.log`; no waiting."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603  # the demo's and the tests' own commands
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
    return PeerProcess(name=name, host=host, process=process, log_path=log_path)


def wait_ready(
    peer: PeerProcess,
    ready: Readiness,
    timeout: float = STARTUP_TIMEOUT,
    *,
    on_wait: Callable[[str], None] | None = None,
    every: float = PROGRESS_EVERY,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> PeerProcess:
    """Wait until `peer` is ready; stop it and raise PeerStartError if it exits or times out.
    `on_wait` is told every `every` seconds that the wait goes on (a JVM emulator takes seconds)."""
    started = monotonic()
    deadline, next_word = started + timeout, started + every
    while not _is_ready(peer, ready):
        now = monotonic()
        if on_wait is not None and now >= next_word:
            on_wait(f"still waiting for {peer.name} ({now - started:.0f} s)")
            next_word += every
        if peer.process.poll() is not None:
            peer.stop()
            raise PeerStartError(
                f"{peer.name} exited with {peer.process.returncode} before it was ready; log tail "
                f"({peer.log_path}):\n{log_tail(peer.log_path)}"
            )
        if now > deadline:
            peer.stop()
            what = f"print {ready!r}" if isinstance(ready, str) else "become ready"
            raise PeerStartError(
                f"{peer.name} did not {what} within {timeout:.0f} s; log tail ({peer.log_path}):\n"
                f"{log_tail(peer.log_path)}"
            )
        sleep(0.05)
    return peer


def _is_ready(peer: PeerProcess, ready: Readiness) -> bool:
    if isinstance(ready, str):
        try:
            return ready in peer.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
    return ready()


def accepts_connections(host: str) -> Callable[[], bool]:
    """A readiness check: something accepts TCP connections on "HOST:PORT"."""
    address, _, port = host.rpartition(":")

    def check() -> bool:
        try:
            with socket.create_connection((address, int(port)), timeout=0.5):
                return True
        except OSError:
            return False

    return check


def start_peer(
    name: str, command: Sequence[str], host: str, ready: Readiness, log_dir: Path, timeout: float = STARTUP_TIMEOUT
) -> PeerProcess:
    """Start `command` in a new process group and wait until it is ready (see `wait_ready`)."""
    return wait_ready(launch(name, command, host, log_dir), ready, timeout)


def launch_emulator(emulator: Emulator, log_dir: Path, sdk_root: Path | None = None) -> PeerProcess:
    """Start `emulator` on a free loopback port without waiting (several can start at once).

    Raises:
        EmulatorMissingError: it (or gcloud, or Java) is not installed.
    """
    launcher = emulator_launcher(emulator, sdk_root)
    port = free_port()
    return launch(emulator.name, [str(launcher), "--host=127.0.0.1", f"--port={port}"], f"127.0.0.1:{port}", log_dir)


def start_emulator(emulator: Emulator, log_dir: Path, sdk_root: Path | None = None) -> PeerProcess:
    """Start `emulator` on a free loopback port and wait until it serves.

    Raises:
        EmulatorMissingError: it (or gcloud, or Java) is not installed.
        PeerStartError: it did not start.
    """
    return wait_ready(launch_emulator(emulator, log_dir, sdk_root), emulator.ready_text)
