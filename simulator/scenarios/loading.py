"""Finding a scenario: a built-in one by name, or a JSON or YAML scenario file.

PyYAML is optional: only YAML scenario files need it.
"""

from __future__ import annotations

import json
from pathlib import Path

from simulator.scenarios.built_in import BUILT_IN, SCENARIO_NAMES
from simulator.scenarios.model import Scenario, ScenarioError
from simulator.scenarios.parsing import parse_scenario


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario file (.json, .yaml or .yml)."""
    if name_or_path in BUILT_IN:
        return parse_scenario(BUILT_IN[name_or_path], name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise ScenarioError(
            f"unknown scenario {name_or_path!r}: use a built-in one ({', '.join(SCENARIO_NAMES)}) "
            f"or the path of a .json/.yaml scenario file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"scenario file {path}: cannot read it: {exc}") from None
    suffix = path.suffix.lower()
    if suffix in {".yaml", ".yml"}:
        data = _load_yaml(path, text)
    elif suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ScenarioError(f"scenario file {path}: not valid JSON: {exc}") from None
    else:
        raise ScenarioError(f"scenario file {path}: name it .json, .yaml or .yml so its format is known")
    return parse_scenario(data, str(path))


def _load_yaml(path: Path, text: str) -> object:
    # PyYAML is optional: only YAML scenario files need it.
    try:
        import yaml
    except ImportError:
        raise ScenarioError(
            f"scenario file {path} is YAML but PyYAML is not installed: install PyYAML (pip install pyyaml) "
            f"or use a JSON scenario file"
        ) from None
    try:
        loaded: object = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"scenario file {path}: not valid YAML: {exc}") from None
    return loaded
