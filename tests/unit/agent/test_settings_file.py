"""The agent's TOML config file (--config / MBRIDGE_CONFIG), and the order in which the sources of a
setting win: flag, then environment, then config file, then the built-in default."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import SETTINGS, AgentSettings, ConfigError, settings_from_args
from mbridge.cli import build_parser, main


def settings(*argv: str) -> AgentSettings:
    return settings_from_args(build_parser("agent").parse_args(["agent", *argv]))


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_each_source_wins_over_the_next(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = write(tmp_path / "agent.toml", 'cloud = "azure"\npoll-interval = 3\n')
    # the default alone
    assert settings("--cloud", "azure").poll_interval == 1.0
    # the file over the default
    assert settings("--config", str(config)).poll_interval == 3.0
    # the environment over the file
    clean_env.setenv("MBRIDGE_POLL_INTERVAL", "2")
    assert settings("--config", str(config)).poll_interval == 2.0
    # the flag over the environment
    assert settings("--config", str(config), "--poll-interval", "1.5").poll_interval == 1.5


def test_a_flag_equal_to_the_default_still_wins_over_the_file(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # `--transport jsonl` is the default's value: said on the command line, it must still win.
    config = write(tmp_path / "agent.toml", 'cloud = "azure"\ntransport = "local"\ninsecure-unsigned-commands = true\n')
    assert settings("--config", str(config)).transport == "local"
    assert settings("--config", str(config), "--transport", "jsonl").transport == "jsonl"


def test_a_switch_turned_on_in_the_environment_is_turned_off_by_its_no_flag(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("MBRIDGE_DRY_RUN", "yes")
    assert settings("--cloud", "azure").dry_run is True
    assert settings("--cloud", "azure", "--no-dry-run").dry_run is False


def test_the_config_file_can_be_named_by_the_environment(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = write(
        tmp_path / "agent.toml",
        'cloud = "gce"\ndry-run = true\nharmless-freeze-seconds = 30\nlisten = "off"\nlog-level = "debug"\n',
    )
    clean_env.setenv("MBRIDGE_CONFIG", str(config))
    read = settings()
    assert (read.cloud.value, read.dry_run, read.harmless_freeze_seconds, read.listen, read.log_level) == (
        "gce",
        True,
        30,
        None,
        "DEBUG",
    )
    assert read.config_file == config


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("poll_interval = 2\n", "unknown key 'poll_interval'; the nearest known one is 'poll-interval'"),
        ("transprot = 'local'\n", "unknown key 'transprot'; the nearest known one is 'transport'"),
        ("config = 'other.toml'\n", "'config' cannot be set inside a config file"),
        ("[agent]\ncloud = 'azure'\n", "'agent' is a table"),
        ("cloud = ['azure']\n", "cloud: a list"),
        ("cloud = 'azure\n", "not TOML"),
    ],
    ids=["underscore", "typo", "config", "table", "list", "syntax"],
)
def test_a_config_file_it_cannot_use_is_one_error_naming_the_file_and_the_key(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, text: str, said: str
) -> None:
    config = write(tmp_path / "agent.toml", text)
    with pytest.raises(ConfigError) as refused:
        settings("--config", str(config))
    message = str(refused.value)
    assert message.startswith("config (--config / MBRIDGE_CONFIG): "), message
    assert str(config) in message
    assert said in message


def test_a_missing_config_file_exits_2_with_one_line(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["agent", "--config", str(tmp_path / "absent.toml"), "--check"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("mbridge agent: config (--config / MBRIDGE_CONFIG): ")
    assert "absent.toml" in line


def test_every_setting_has_its_flag_variable_and_key_from_one_name() -> None:
    # The reference, the parser and the file reader all derive from this table: a setting whose
    # names drift apart would be documented under one name and read under another.
    for setting in SETTINGS:
        assert setting.flag == "--" + setting.key
        assert setting.env == "MBRIDGE_" + setting.name.upper()
        assert setting.key == setting.name.replace("_", "-")
        assert setting.help
