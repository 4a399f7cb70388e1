"""Bus settings that cannot work together, or a value of the wrong shape, are configuration errors:
`mbridge agent --check` and the start exit 2 (docs/operations.md#configuration: the installer stops
on 2, "fix the setting, retrying cannot help") rather than 1, which is for what may pass (a bus
unreachable, a role not granted yet)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.main import EXIT_CONFIG
from mbridge.cli import main
from simulator import Simulator
from tests.unit.agent.test_settings_check import check_named, free_port

VM = "vm-0"
NAMESPACE = "mybus.servicebus.windows.net"
CONNECTION_STRING = f"Endpoint=sb://{NAMESPACE}/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0"

WRONG = {
    "a namespace and a connection string": [
        "--transport", "servicebus", "--servicebus-namespace", NAMESPACE,
        "--servicebus-connection-string", CONNECTION_STRING,
    ],
    "a namespace that is not a fully qualified name": ["--transport", "servicebus", "--servicebus-namespace", "mybus"],
    "a connection string given as the namespace": [
        "--transport", "servicebus", "--servicebus-namespace", CONNECTION_STRING,
    ],
    "a malformed connection string": [
        "--transport", "servicebus", "--servicebus-connection-string", "SharedAccessKey=c2VjcmV0",
    ],
    "a commands topic without this VM's subscription of it": [
        "--transport", "servicebus", "--servicebus-namespace", NAMESPACE,
        "--servicebus-commands-topic", "maintenance-commands",
    ],
    "pubsub without a project": ["--transport", "pubsub"],
}  # fmt: skip
# Checked by building the Service Bus client, which the 3.9 compatibility run does not install.
NEEDS_THE_SDK = {
    "a namespace and a connection string",
    "a namespace that is not a fully qualified name",
    "a connection string given as the namespace",
    "a malformed connection string",
}


def _has_servicebus() -> bool:
    try:
        return importlib.util.find_spec("azure.servicebus") is not None
    except ModuleNotFoundError:  # no `azure` package at all
        return False


WITHOUT_THE_SDK = pytest.mark.skipif(
    not _has_servicebus(), reason="azure-servicebus is not installed (the 3.9 compatibility run omits it)"
)
CASES = [
    pytest.param(bus, id=name, marks=WITHOUT_THE_SDK if name in NEEDS_THE_SDK else ()) for name, bus in WRONG.items()
]


@pytest.fixture(scope="module")
def azure() -> Iterator[str]:
    with Simulator(cloud="azure", vm_names=[VM]) as sim:
        yield sim.base_urls[0]


def agent_flags(metadata_url: str, state_dir: Path, bus: list[str]) -> list[str]:
    return [
        "--cloud", "azure", "--metadata-url", metadata_url, "--vm-name", VM, "--identity-proof", "none",
        "--state-dir", str(state_dir), "--listen", "off", "--insecure-unsigned-commands", *bus,
    ]  # fmt: skip


@pytest.mark.parametrize("bus", CASES)
def test_check_calls_bus_settings_that_cannot_work_a_configuration_error(
    clean_env: pytest.MonkeyPatch, azure: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], bus: list[str]
) -> None:
    code = main(["agent", "--check", *agent_flags(azure, tmp_path, bus)])

    out, err = capsys.readouterr()
    assert code == EXIT_CONFIG, out + err
    said = [line for line in [*out.splitlines(), *err.splitlines()] if "--servicebus-" in line or "--pubsub-" in line]
    assert said, out + err  # it names the setting to fix
    assert "c2VjcmV0" not in out + err  # and never repeats the key
    if out:  # the checks ran: the bus's is the line that says it
        verdict, text = check_named(out, "bus")
        assert verdict == "PROBLEM"
        assert text in said[0]
        assert out.rstrip().endswith("a configuration error: see the PROBLEM lines above")


@pytest.mark.parametrize("bus", CASES)
def test_the_start_refuses_them_at_once_with_one_line_and_exit_2(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], bus: list[str]
) -> None:
    # GIVEN no metadata service at all: the start must not get as far as waiting for one
    code = main(["agent", *agent_flags(f"http://127.0.0.1:{free_port()}", tmp_path, bus)])

    err = capsys.readouterr().err
    assert code == EXIT_CONFIG, err
    (line,) = err.splitlines()
    assert line.startswith("mbridge agent: ")
    assert "--servicebus-" in line or "--pubsub-" in line
    assert "c2VjcmV0" not in line
