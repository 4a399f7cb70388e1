"""`python -m simulator.cli` as a process: URLs first on stdout, logs on stderr, clean exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests

from functions.trust.gce_token import verify_identity_token
from simulator import SCENARIO_NAMES

REPO = Path(__file__).resolve().parents[3]


def simulator_process(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def run_to_exit(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "simulator.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=30,
    )


def test_prints_urls_first_serves_and_exits_0_on_sigterm(processes: list[subprocess.Popen[str]]) -> None:
    # GIVEN the simulator started with the live-migration scenario (two VMs)
    process = simulator_process("--scenario", "azure-live-migration", "--speed", "60")
    processes.append(process)
    assert process.stdout is not None
    # WHEN its first stdout lines are read
    urls = [process.stdout.readline().strip() for _ in range(2)]
    # THEN they are bare base URLs on consecutive ports, and they serve the VMs' documents
    assert all(url.startswith("http://127.0.0.1:") for url in urls)
    assert int(urls[1].rsplit(":", 1)[1]) == int(urls[0].rsplit(":", 1)[1]) + 1
    names = [
        requests.get(
            f"{url}/metadata/instance/compute/name",
            params={"api-version": "2021-02-01", "format": "text"},
            headers={"Metadata": "true"},
            timeout=5,
        ).text
        for url in urls
    ]
    assert names == ["WestNO_0", "WestNO_1"]
    added = requests.post(f"{urls[0]}/_sim/events", json={"event_type": "Reboot", "event_id": "CLI-1"}, timeout=5)
    assert added.status_code == 201
    # WHEN it gets SIGTERM
    process.send_signal(signal.SIGTERM)
    rest, errors = process.communicate(timeout=20)
    # THEN it exits 0, stdout had nothing but the URLs, and stderr logged what happened, one line each
    assert process.returncode == 0, errors
    assert rest == ""
    assert "scenario azure-live-migration" in errors
    assert "event CLI-1 added: Reboot Scheduled" in errors
    assert "stopping" in errors.splitlines()[-1]


def test_exits_0_on_sigint_and_serves_gce_vms(processes: list[subprocess.Popen[str]]) -> None:
    # GIVEN a GCE simulator with two named VMs
    process = simulator_process("--cloud", "gce", "--vm-name", "alpha", "--vm-name", "beta")
    processes.append(process)
    assert process.stdout is not None
    urls = [process.stdout.readline().strip() for _ in range(2)]
    # WHEN each is asked its name, then the process gets SIGINT (Ctrl-C)
    names = [
        requests.get(f"{url}/computeMetadata/v1/instance/name", headers={"Metadata-Flavor": "Google"}, timeout=5).text
        for url in urls
    ]
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=20)
    # THEN each URL was its VM, and the exit is clean
    assert names == ["alpha", "beta"]
    assert process.returncode == 0


def test_unknown_scenario_exits_2_listing_the_names() -> None:
    # WHEN an unknown scenario is asked for
    result = run_to_exit("--scenario", "azure-asteroid")
    # THEN exit code 2, nothing on stdout, and the built-in names on stderr
    assert result.returncode == 2
    assert result.stdout == ""
    assert all(name in result.stderr for name in SCENARIO_NAMES)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speed", "0"], "--speed"),
        (["--speed", "fast"], "--speed"),
        (["--cloud", "aws"], "--cloud"),
        (["--port", "70000"], "--port"),
        (["--cloud", "gce", "--scenario", "azure-redeploy"], "--cloud azure"),
        (["--vm-name", "a", "--vm-name", "a"], "unique"),
    ],
)
def test_bad_flags_exit_2_with_a_message(args: list[str], message: str) -> None:
    # WHEN the simulator gets unusable flags
    result = run_to_exit(*args)
    # THEN it exits 2 and says which
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""


def test_writes_the_trust_file_of_its_run_before_printing_the_urls(
    processes: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    # GIVEN the simulator asked to write its trust file
    trust = tmp_path / "trust.json"
    process = simulator_process("--cloud", "gce", "--vm-name", "alpha", "--trust-file", str(trust))
    processes.append(process)
    assert process.stdout is not None
    (url,) = [process.stdout.readline().strip()]

    # WHEN a token is asked of it for an audience, and checked with the functions' verifier from that file
    token = requests.get(
        f"{url}/computeMetadata/v1/instance/service-accounts/default/identity",
        params={"audience": "maintenance-bridge/check", "format": "full"},
        headers={"Metadata-Flavor": "Google"},
        timeout=5,
    ).text
    document = json.loads(trust.read_text(encoding="utf-8"))
    now = datetime.now(timezone.utc)
    vm = verify_identity_token(
        token, certs=document["gce"]["certs"], audience="maintenance-bridge/check", valid_at=now, now=now
    )

    # THEN the file was there once the URL was printed, readable by its owner only, and it verifies the run's tokens
    assert vm.instance_name == "alpha"
    assert trust.stat().st_mode & 0o777 == 0o600
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=20)
