"""How a setting is defined once and read from every source.

A `Setting` names one value the agent reads. Its command-line flag, its MBRIDGE_* variable and its
key in the TOML config file all derive from that one name, and every value, whatever its source,
is text checked by the setting's `Kind`: an environment variable or a config file gets exactly the
validation a flag gets. The table itself is agent.config.SETTINGS; this module is the machinery:
argparse flags, resolution (flag > environment > config file > default), the config file, the
one-line errors and the Markdown reference (docs/operations.md#configuration).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from wire.errors import PermanentError

TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")


class ConfigError(PermanentError):
    """A setting is missing or invalid; the message names the flag, its variable and its config key."""


class Kind:
    """What text a setting takes, and the value it stands for."""

    metavar = "TEXT"
    allowed = "text"

    def parse(self, text: str) -> Any:
        """The value of `text`; raises ValueError saying what is wrong with it."""
        return text

    @property
    def fix(self) -> str:
        return f"use {self.allowed}"


class Text(Kind):
    def __init__(self, metavar: str = "TEXT", *, spaces: bool = True) -> None:
        self.metavar = metavar
        self.spaces = spaces
        self.allowed = "text" if spaces else "text without spaces"

    def parse(self, text: str) -> Any:
        if not self.spaces and any(c.isspace() for c in text):
            raise ValueError("contains a space")
        return text


class Choice(Kind):
    def __init__(self, values: Sequence[str], *, upper: bool = False) -> None:
        self.values = tuple(values)
        # Log levels are upper case by convention, everything else lower; either is read in any case.
        self.upper = upper
        self.metavar = "{" + ",".join(self.values) + "}"
        self.allowed = "one of " + ", ".join(self.values)

    def parse(self, text: str) -> Any:
        wanted = text.strip().upper() if self.upper else text.strip().lower()
        if wanted not in self.values:
            raise ValueError("is not a value it takes")
        return wanted


class Number(Kind):
    def __init__(
        self, minimum: float, *, integer: bool = False, unit: str = "", why: str = "", maximum: float | None = None
    ) -> None:
        self.minimum = minimum
        self.maximum = maximum
        self.integer = integer
        self.why = why
        self.metavar = "N" if integer else "S"
        self.noun = "a whole number" if integer else "a number"
        self.allowed = f"{self.noun}{' of ' + unit if unit else ''} >= {minimum:g}" + (
            f" and <= {maximum:g}" if maximum is not None else ""
        )

    def parse(self, text: str) -> Any:
        try:
            value: float = int(text) if self.integer else float(text)
        except ValueError:
            raise ValueError(f"is not {self.noun}") from None
        if value != value or value in (float("inf"), float("-inf")):  # NaN, inf: float() takes them
            raise ValueError(f"is not {self.noun}")
        if value < self.minimum:
            raise ValueError(f"is below {self.minimum:g}{': ' + self.why if self.why else ''}")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"is above {self.maximum:g}")
        return value


class Boolean(Kind):
    """A switch: on the command line --x / --no-x; elsewhere these words only, so that a typo
    such as `MBRIDGE_DRY_RUN=ture` is an error rather than a silent false."""

    metavar = "BOOL"
    allowed = "true or false (also yes/no, 1/0; any case)"

    def parse(self, text: str) -> Any:
        word = text.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise ValueError("is not a word for true or false")


class Listen(Kind):
    metavar = "HOST:PORT"
    allowed = "HOST:PORT (port 0: any free port) or off"

    def parse(self, text: str) -> Any:
        if text.strip().lower() in ("off", "none"):
            return None
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError("is not HOST:PORT with a port from 0 to 65535")
        return (host.strip("[]") or "127.0.0.1", int(port))


class Url(Kind):
    metavar = "URL"
    allowed = "an http:// or https:// URL"

    def parse(self, text: str) -> Any:
        if not text.startswith(("http://", "https://")) or len(text.split("://", 1)[1].strip("/")) == 0:
            raise ValueError("is not a URL with its scheme")
        return text.rstrip("/")


class PathKind(Kind):
    metavar = "PATH"
    allowed = "a path"


TEXT = Text()


@dataclass(frozen=True)
class Setting:
    """One setting: `name` is the attribute (poll_interval); flag, variable and key derive from it."""

    name: str
    # Spelled out rather than derived, so that a search for a variable finds where it is read.
    env: str
    help: str
    kind: Kind = TEXT
    # As text, read like any other source; None: not set unless a source sets it.
    default: str | None = None
    # The reference's default where it is worked out at run time (e.g. from the cloud).
    default_doc: str = ""
    # agent (what to watch and how), transport (the bus), logging, config (the file itself)
    group: str = "agent"
    # Never repeated in an error message (a connection string holds a key).
    secret: bool = False
    in_file: bool = True

    @property
    def flag(self) -> str:
        return "--" + self.key

    @property
    def key(self) -> str:
        return self.name.replace("_", "-")

    @property
    def label(self) -> str:
        return self.name.replace("_", " ")

    @property
    def switch(self) -> bool:
        return isinstance(self.kind, Boolean)

    def names(self) -> str:
        """Every place this setting can be given, as the error lines name them."""
        key = f" / config key {self.key}" if self.in_file else ""
        return f"{self.flag} / {self.env}{key}"

    def error(self, problem: str, fix: str = "") -> ConfigError:
        """`<setting> (--flag / MBRIDGE_X / config key k): <what is wrong>; <what to do>`"""
        return ConfigError(f"{self.label} ({self.names()}): {problem}; {fix or self.kind.fix}")

    def help_text(self) -> str:
        default = self.default_doc or self.default
        return f"{self.help} [{self.env}{', default ' + default if default else ''}]"


class _FromEnvironment(str):
    """A flag's argparse default taken from its variable: what callers that read the parsed
    arguments directly see, marked so that resolution does not take it for a flag."""


class _BuiltIn(str):
    """A flag's argparse default taken from the table: loses to the environment and the file."""


@dataclass(frozen=True)
class Origin:
    """Where a value came from, as an error names it."""

    source: str  # "flag", "environment", "config file", "default"
    text: str
    setting: Setting
    where: str = ""  # the config file

    def describe(self) -> str:
        value = "the value" if self.setting.secret else repr(self.text)
        if self.source == "flag":
            return f"{value} from {self.setting.flag}"
        if self.source == "environment":
            return f"{value} from {self.setting.env}"
        if self.source == "config file":
            return f"{value} from {self.setting.key} in {self.where}"
        return f"the default {value}"


def add_arguments(
    parser: argparse.ArgumentParser | Any, settings: Iterable[Setting], environ: Mapping[str, str]
) -> None:
    """One flag per setting, with no `type` nor `choices`: argparse would check a flag's value but
    not a default taken from the environment, so every value is checked later, the same way."""
    for setting in settings:
        if setting.switch:
            parser.add_argument(
                setting.flag, action=argparse.BooleanOptionalAction, default=None, help=setting.help_text()
            )
            continue
        from_env = environ.get(setting.env) or None
        default: str | None = None
        if from_env is not None:
            default = _FromEnvironment(from_env)
        elif setting.default is not None:
            default = _BuiltIn(setting.default)
        parser.add_argument(setting.flag, default=default, metavar=setting.kind.metavar, help=setting.help_text())


def resolve(
    table: Sequence[Setting],
    names: Iterable[str],
    args: argparse.Namespace,
    environ: Mapping[str, str],
    defaults: Mapping[str, str | None] | None = None,
) -> tuple[dict[str, Any], dict[str, Origin | None], Path | None]:
    """The value of each setting in `names`: its flag, else its variable, else the config file
    (--config / MBRIDGE_CONFIG), else its default (`defaults` replaces the table's for a command
    that needs another). Returns the values, where each came from (None: not set) and the config
    file read. Raises ConfigError, in the one-line form, for the first value that does not parse."""
    by_name = {setting.name: setting for setting in table}
    config_path, file_values = read_config_file(table, args, environ)
    values: dict[str, Any] = {}
    origins: dict[str, Origin | None] = {}
    for name in names:
        setting = by_name[name]
        origin = _origin(setting, args, environ, file_values, config_path, defaults or {})
        origins[name] = origin
        if origin is None:
            values[name] = None
            continue
        try:
            values[name] = setting.kind.parse(origin.text)
        except ValueError as exc:
            raise setting.error(f"{origin.describe()} {exc}") from None
    return values, origins, config_path


def _origin(
    setting: Setting,
    args: argparse.Namespace,
    environ: Mapping[str, str],
    file_values: Mapping[str, str],
    config_path: Path | None,
    defaults: Mapping[str, str | None],
) -> Origin | None:
    given = getattr(args, setting.name, None)
    if isinstance(given, bool):  # a switch said on the command line
        return Origin("flag", "true" if given else "false", setting)
    if isinstance(given, str) and not isinstance(given, (_FromEnvironment, _BuiltIn)) and given != "":
        return Origin("flag", given, setting)
    from_env = environ.get(setting.env)
    if from_env:  # an empty variable is unset: an environment file may list every name
        return Origin("environment", from_env, setting)
    if setting.key in file_values:
        return Origin("config file", file_values[setting.key], setting, str(config_path))
    default = defaults.get(setting.name, setting.default)
    return None if default is None else Origin("default", default, setting)


# ---------------------------------------------------------------- the config file


def config_setting(table: Sequence[Setting]) -> Setting:
    (found,) = [setting for setting in table if not setting.in_file]
    return found


def read_config_file(
    table: Sequence[Setting], args: argparse.Namespace, environ: Mapping[str, str]
) -> tuple[Path | None, dict[str, str]]:
    """The config file named by --config or its variable, as text per key; ({}, None) without one."""
    config = config_setting(table)
    given = getattr(args, config.name, None)
    if isinstance(given, str) and given and not isinstance(given, (_FromEnvironment, _BuiltIn)):
        path_text: str | None = given
    else:
        path_text = environ.get(config.env) or None
    if path_text is None:
        return None, {}
    path = Path(path_text)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise config.error(f"cannot read {path} ({exc})", "give a readable TOML file or leave it unset") from None
    try:
        document = _toml_loads(config)(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise config.error(f"{path} is not TOML ({exc})", "fix its syntax (https://toml.io)") from None
    return path, _file_values(table, config, path, document)


def _file_values(table: Sequence[Setting], config: Setting, path: Path, document: Mapping[str, Any]) -> dict[str, str]:
    keys = {setting.key for setting in table if setting.in_file}
    values = {}
    for key, value in document.items():
        if key == config.key:
            raise config.error(
                f"{path}: 'config' cannot be set inside a config file", "name the file with --config or MBRIDGE_CONFIG"
            )
        if isinstance(value, dict):  # a [section]: said as such, not as an unknown key
            raise config.error(f"{path}: {key!r} is a table", "settings are top-level keys, with no [section]")
        if key not in keys:
            nearest = difflib.get_close_matches(key.replace("_", "-").lower(), sorted(keys), n=1, cutoff=0.0)
            raise config.error(
                f"{path}: unknown key {key!r}; the nearest known one is {nearest[0]!r}",
                "keys are the flags without their leading dashes (docs/operations.md#configuration)",
            )
        values[key] = _as_text(config, path, key, value)
    return values


def _as_text(config: Setting, path: Path, key: str, value: object) -> str:
    """A TOML value as the text every source gives, so it is checked the same way."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    what = "a list" if isinstance(value, list) else f"a {type(value).__name__}"
    raise config.error(f"{path}: {key}: {what}", "give a string, a number or true/false")


def _toml_loads(config: Setting) -> Callable[[str], dict[str, Any]]:
    """tomllib from Python 3.11 on; before, the tomli package (the same parser)."""
    name = "tomllib" if sys.version_info >= (3, 11) else "tomli"
    try:
        module = importlib.import_module(name)
    except ImportError:
        raise config.error(
            f"reading a config file on Python {sys.version_info[0]}.{sys.version_info[1]} needs the tomli package",
            "pip install 'tomli>=2', or use flags and MBRIDGE_* variables",
        ) from None
    loads: Callable[[str], dict[str, Any]] = module.loads
    return loads


# ---------------------------------------------------------------- the reference


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_table(table: Sequence[Setting]) -> str:
    """The Markdown table of every setting, in the table's order."""
    rows = [
        "| setting | flag | variable | config key | default | allowed values | meaning |",
        "|---|---|---|---|---|---|---|",
    ]
    for setting in table:
        default = setting.default_doc or (f"`{setting.default}`" if setting.default is not None else "(none)")
        flag = f"`{setting.flag}` / `--no-{setting.key}`" if setting.switch else f"`{setting.flag}`"
        key = f"`{setting.key}`" if setting.in_file else "(not in the file)"
        rows.append(
            "| "
            + " | ".join(
                _cell(cell)
                for cell in (
                    setting.label,
                    flag,
                    f"`{setting.env}`",
                    key,
                    default,
                    setting.kind.allowed,
                    setting.help,
                )
            )
            + " |"
        )
    return "\n".join(rows) + "\n"
