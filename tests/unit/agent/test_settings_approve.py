"""`mbridge approve` reads its bus from the agent's settings (flag, environment or the agent's config
file) and refuses to guess one: a configuration error exits 2 with one line saying what to set,
before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from mbridge.cli import main
from wire.transports.local import LocalBus

EVENT_ID = "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"
APPROVE = ["approve", "--event-id", EVENT_ID, "--target", "vm-0", "--insecure-unverified-results", "--no-wait"]


def approve(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main([*APPROVE, *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_without_a_transport_it_says_to_set_one(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = approve([], capsys)
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith("mbridge approve: transport (--transport / MBRIDGE_TRANSPORT / config key transport): ")
    assert "not set" in line
    assert "local, servicebus or pubsub" in line


def test_jsonl_is_refused_as_a_configuration_error(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv("MBRIDGE_TRANSPORT", "jsonl")
    code, _, err = approve([], capsys)
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith("mbridge approve: transport (--transport / MBRIDGE_TRANSPORT / config key transport): ")
    assert "'jsonl' from MBRIDGE_TRANSPORT" in line


def test_a_bad_cloud_in_the_environment_is_one_line_not_a_traceback(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv("MBRIDGE_CLOUD", "aws")
    code, _, err = approve(["--transport", "local"], capsys)
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith("mbridge approve: cloud (--cloud / MBRIDGE_CLOUD / config key cloud): ")


def test_the_bus_is_taken_from_the_agents_config_file(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # GIVEN the agent's own config file, naming its local bus (and settings approve has no use for)
    bus_path = tmp_path / "bus.db"
    LocalBus(bus_path).close()
    config = tmp_path / "agent.toml"
    config.write_text(
        f'cloud = "azure"\ntransport = "local"\nbus-path = "{bus_path}"\npoll-interval = 2\n', encoding="utf-8"
    )
    clean_env.setenv("MBRIDGE_CONFIG", str(config))

    # WHEN approve runs with no transport flag
    code, out, err = approve([], capsys)

    # THEN the command went onto that bus, for the target VM
    assert code == 0, err
    bus = LocalBus(bus_path)
    try:
        (command,) = bus.open_commands("vm-0")
    finally:
        bus.close()
    assert EVENT_ID.encode() in command[1]
    assert out.strip()  # the command_id
