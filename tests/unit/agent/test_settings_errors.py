"""`mbridge agent` with a setting it cannot use: whichever source the value came from (flag,
environment, config file), it is checked the same way and refused with one line and exit 2,
which the installer reads as "fix the configuration" (infra/agent/install-agent.sh)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mbridge.cli import main

# `mbridge agent: <setting> (--flag / MBRIDGE_X / config key K): <what is wrong>; <what to do>`
ONE_LINE = re.compile(r"^mbridge agent: [a-z ]+ \(--[a-z-]+ / MBRIDGE_[A-Z_]+( / config key [a-z-]+)?\): .+; .+$")

# (flag without dashes, a value no source may give it)
BAD_VALUES = [
    ("cloud", "aws"),
    ("log-level", "verbose"),
    ("transport", "kafka"),
    ("dry-run", "maybe"),
    ("insecure-unsigned-commands", "on please"),
    ("poll-interval", "fast"),
    ("poll-interval", "0.05"),
    ("harmless-freeze-seconds", "ten"),
    ("harmless-freeze-seconds", "-1"),
    ("api-version", "2099-01-01"),
    ("identity-proof", "maybe"),
    ("forward", "some"),
    ("listen", "nowhere"),
    ("listen", "127.0.0.1:70000"),
    ("metadata-url", "169.254.169.254"),
    ("identity-audience", "two words"),
]
IDS = [f"{key}={value}" for key, value in BAD_VALUES]
# A switch takes no value on the command line (--dry-run / --no-dry-run): its bad values can only
# come from the environment or the config file.
SWITCHES = ("dry-run", "insecure-unsigned-commands")
COMMAND_LINE_BAD_VALUES = [(key, value) for key, value in BAD_VALUES if key not in SWITCHES]
COMMAND_LINE_IDS = [f"{key}={value}" for key, value in COMMAND_LINE_BAD_VALUES]


def env_name(key: str) -> str:
    return "MBRIDGE_" + key.upper().replace("-", "_")


def agent(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit code and stderr of `mbridge agent ARGV`, run in this process (a traceback fails the test)."""
    try:
        code = main(["agent", *argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def assert_one_line_naming(err: str, key: str, value: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert ONE_LINE.match(lines[0]), lines[0]
    assert f"--{key} " in lines[0], lines[0]
    assert env_name(key) in lines[0], lines[0]
    assert f"config key {key}" in lines[0], lines[0]
    assert value in lines[0], lines[0]


@pytest.mark.parametrize(("key", "value"), BAD_VALUES, ids=IDS)
def test_a_bad_value_from_the_environment_exits_2_with_one_line(
    key: str, value: str, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv(env_name(key), value)
    if key != "cloud":
        clean_env.setenv("MBRIDGE_CLOUD", "azure")

    code, err = agent(["--check"], capsys)

    assert code == 2, err
    assert_one_line_naming(err, key, value)
    assert "Traceback" not in err


@pytest.mark.parametrize(("key", "value"), COMMAND_LINE_BAD_VALUES, ids=COMMAND_LINE_IDS)
def test_a_bad_value_on_the_command_line_gets_the_same_one_line(
    key: str, value: str, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cloud = [] if key == "cloud" else ["--cloud", "azure"]

    code, err = agent([*cloud, f"--{key}", value, "--check"], capsys)

    assert code == 2, err
    assert_one_line_naming(err, key, value)


@pytest.mark.parametrize(("key", "value"), BAD_VALUES, ids=IDS)
def test_a_bad_value_in_the_config_file_gets_the_same_one_line(
    key: str, value: str, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "agent.toml"
    lines = [f'{key} = "{value}"']
    if key != "cloud":
        lines.append('cloud = "azure"')
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")

    code, err = agent(["--config", str(config), "--check"], capsys)

    assert code == 2, err
    assert_one_line_naming(err, key, value)
    assert str(config) in err


@pytest.mark.parametrize("text", ["true", "TRUE", "1", "yes", "Yes"])
def test_a_switch_is_on_for_the_documented_spellings_only(text: str, clean_env: pytest.MonkeyPatch) -> None:
    from agent.config import settings_from_args
    from mbridge.cli import build_parser

    clean_env.setenv("MBRIDGE_DRY_RUN", text)
    assert settings_from_args(build_parser("agent").parse_args(["agent", "--cloud", "azure"])).dry_run is True
    clean_env.setenv("MBRIDGE_DRY_RUN", {"true": "false", "1": "0"}.get(text.lower(), "no"))
    assert settings_from_args(build_parser("agent").parse_args(["agent", "--cloud", "azure"])).dry_run is False


def test_a_missing_cloud_says_every_place_to_set_it(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = agent(["--check"], capsys)
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith("mbridge agent: cloud (--cloud / MBRIDGE_CLOUD / config key cloud): "), line
    assert "azure" in line
    assert "gce" in line


def test_a_bus_without_a_verify_key_is_one_line_naming_both_ways_out(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv("MBRIDGE_TRANSPORT", "local")
    code, err = agent(["--cloud", "azure"], capsys)
    assert code == 2
    (line,) = err.splitlines()
    assert ONE_LINE.match(line), line
    assert "MBRIDGE_VERIFY_KEY" in line
    assert "--insecure-unsigned-commands" in line
