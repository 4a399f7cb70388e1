"""`mbridge agent --check` as a process: every start-up check, one line each, and an exit code the
installer can act on (0 all ok, 1 problems worth retrying, 2 a configuration the agent refuses)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.health import HealthServer, Metrics, Readiness
from simulator import Simulator
from tests.agent_runner import ROOT
from wire.signing import generate_keypair
from wire.version import version

VM = "vm-0"
CHECKS = [
    "configuration",
    "verify key",
    "state directory",
    "listen address",
    "transport",
    "metadata service",
    "this VM's name",
    "proof of identity",
    "bus",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def mbridge_agent(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    # Only what the test gives: the machine's own MBRIDGE_* variables must not change the outcome.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MBRIDGE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(pythonpath)] if pythonpath else []) + os.pathsep + str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "mbridge.cli", "agent", *args],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
        env=env,
    )


def verdicts(stdout: str) -> list[tuple[str, str]]:
    """(ok|PROBLEM, what) of each check line, the summary left out."""
    found = []
    for line in stdout.splitlines():
        verdict, _, text = line.partition(" ")
        if verdict in ("ok", "PROBLEM"):
            found.append((verdict, text.strip()))
    return found


def check_named(stdout: str, name: str) -> tuple[str, str]:
    matching = [(verdict, text) for verdict, text in verdicts(stdout) if text.startswith(name)]
    assert len(matching) == 1, stdout
    return matching[0]


@pytest.fixture(scope="module")
def azure() -> Iterator[str]:
    with Simulator(cloud="azure", vm_names=[VM]) as sim:
        yield sim.base_urls[0]


@pytest.fixture
def without_the_servicebus_sdk(tmp_path: Path) -> Path:
    """A directory that, first on the path, makes `azure` unimportable: a plain install without
    the agent-servicebus extra, on a machine where the tests' environment has it."""
    shadow = tmp_path / "no-sdk"
    (shadow / "azure").mkdir(parents=True)
    (shadow / "azure" / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'azure.servicebus\'", name="azure.servicebus")\n'
    )
    return shadow


def test_every_check_prints_one_line_in_order_and_all_ok_exits_0(azure: str, tmp_path: Path) -> None:
    done = mbridge_agent(
        "--check", "--cloud", "azure", "--metadata-url", azure, "--transport", "local",
        "--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0",
        "--verify-key", generate_keypair()[1].decode(),
    )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    found = verdicts(done.stdout)
    assert [verdict for verdict, _ in found] == ["ok"] * len(CHECKS), done.stdout
    for (_, text), name in zip(found, CHECKS):
        assert text.startswith(name), (name, done.stdout)
    assert done.stdout.strip().endswith("healthy")


def test_a_verify_key_that_does_not_load_is_a_configuration_error(azure: str, tmp_path: Path) -> None:
    done = mbridge_agent(
        "--check", "--cloud", "azure", "--metadata-url", azure, "--vm-name", VM, "--identity-proof", "none",
        "--transport", "local", "--state-dir", str(tmp_path), "--listen", "off", "--verify-key", "notakey",
    )  # fmt: skip

    assert done.returncode == 2, done.stdout + done.stderr
    verdict, text = check_named(done.stdout, "verify key")
    assert verdict == "PROBLEM"
    assert "--verify-key" in text
    assert "MBRIDGE_VERIFY_KEY" in text


def test_the_real_start_refuses_the_same_key_with_one_line(azure: str, tmp_path: Path) -> None:
    done = mbridge_agent(
        "--cloud", "azure", "--metadata-url", azure, "--vm-name", VM, "--transport", "local",
        "--state-dir", str(tmp_path), "--listen", "off", "--verify-key", "notakey",
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("mbridge agent: verify key (--verify-key / MBRIDGE_VERIFY_KEY"), line


def test_a_listen_port_in_use_is_a_problem(azure: str, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = mbridge_agent(
            "--check", "--cloud", "azure", "--metadata-url", azure, "--vm-name", VM, "--identity-proof", "none",
            "--state-dir", str(tmp_path), "--listen", f"127.0.0.1:{port}",
        )  # fmt: skip

    assert done.returncode == 1, done.stdout + done.stderr
    verdict, text = check_named(done.stdout, "listen address")
    assert verdict == "PROBLEM"
    assert f"127.0.0.1:{port}" in text
    assert "--listen" in text


def test_a_listen_address_this_machine_does_not_have_is_a_configuration_error(azure: str, tmp_path: Path) -> None:
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never an address of this machine, so binding it fails for good.
    done = mbridge_agent(
        "--check", "--cloud", "azure", "--metadata-url", azure, "--vm-name", VM, "--identity-proof", "none",
        "--state-dir", str(tmp_path), "--listen", "192.0.2.1:9797",
    )  # fmt: skip

    assert done.returncode == 2, done.stdout + done.stderr
    verdict, text = check_named(done.stdout, "listen address")
    assert verdict == "PROBLEM"
    assert "192.0.2.1:9797" in text


def test_a_listen_port_held_by_a_running_agent_is_ok(azure: str, tmp_path: Path) -> None:
    # The installer checks while the agent it upgrades still runs: its port is not a problem.
    server = HealthServer(
        "127.0.0.1",
        0,
        metrics=Metrics(),
        readiness=Readiness(follows_commands=False),
        liveness=lambda: {"healthy": True, "threads": {"poller": True}},
    )
    server.start()
    try:
        port = server.address.rsplit(":", 1)[1]
        done = mbridge_agent(
            "--check", "--cloud", "azure", "--metadata-url", azure, "--vm-name", VM, "--identity-proof", "none",
            "--state-dir", str(tmp_path), "--listen", f"127.0.0.1:{port}",
        )  # fmt: skip
    finally:
        server.stop()

    assert done.returncode == 0, done.stdout + done.stderr
    verdict, text = check_named(done.stdout, "listen address")
    assert verdict == "ok"
    assert f"held by a running mbridge agent (mbridge {version()})" in text


def test_a_state_directory_that_cannot_exist_is_a_configuration_error(tmp_path: Path) -> None:
    done = mbridge_agent(
        "--check", "--cloud", "azure", "--metadata-url", f"http://127.0.0.1:{free_port()}", "--vm-name", VM,
        "--identity-proof", "none", "--state-dir", "/proc/mbridge-state", "--listen", "off",
    )  # fmt: skip

    assert done.returncode == 2, done.stdout + done.stderr
    verdict, text = check_named(done.stdout, "state directory")
    assert verdict == "PROBLEM"
    assert "/proc/mbridge-state" in text


def test_a_transport_whose_sdk_is_not_installed_is_a_configuration_error(
    without_the_servicebus_sdk: Path, tmp_path: Path
) -> None:
    done = mbridge_agent(
        "--check", "--cloud", "azure", "--metadata-url", f"http://127.0.0.1:{free_port()}", "--vm-name", VM,
        "--identity-proof", "none", "--state-dir", str(tmp_path), "--listen", "off",
        "--transport", "servicebus", "--servicebus-namespace", "ns.servicebus.windows.net",
        "--insecure-unsigned-commands",
        pythonpath=without_the_servicebus_sdk,
    )  # fmt: skip

    assert done.returncode == 2, done.stdout + done.stderr
    verdict, text = check_named(done.stdout, "transport")
    assert verdict == "PROBLEM"
    assert "maintenance-bridge[agent-servicebus]" in text
    assert "Traceback" not in done.stdout + done.stderr


def test_the_real_start_without_the_sdk_exits_2_with_one_line(without_the_servicebus_sdk: Path, tmp_path: Path) -> None:
    done = mbridge_agent(
        "--cloud", "azure", "--metadata-url", f"http://127.0.0.1:{free_port()}", "--vm-name", VM,
        "--state-dir", str(tmp_path), "--listen", "off",
        "--transport", "servicebus", "--servicebus-namespace", "ns.servicebus.windows.net",
        "--insecure-unsigned-commands",
        pythonpath=without_the_servicebus_sdk,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("mbridge agent: transport (--transport / MBRIDGE_TRANSPORT / config key transport): ")
    assert "maintenance-bridge[agent-servicebus]" in line
