"""The README's `mbridge agent` examples start as written: each carries every setting the agent
requires with its bus (an example without `--verify-key` exits 2 before doing anything)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from agent.config import ConfigError, settings_from_args
from mbridge.cli import build_parser

ROOT = Path(__file__).resolve().parents[3]
FENCE = re.compile(r"```sh\n(.*?)```", re.DOTALL)


def commands(text: str, program: str) -> list[str]:
    """Every command of the shell blocks that runs `program` (continuation lines joined)."""
    found = []
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            words = line.split("#", 1)[0].strip()
            if re.match(rf"(?:\S*/)?{program} ", words):  # `mbridge agent`, `.venv-demo/bin/mbridge agent`
                found.append(words)
    return found


AGENT_EXAMPLES = commands((ROOT / "README.md").read_text(encoding="utf-8"), "mbridge agent")


def test_the_readme_has_agent_examples_for_both_clouds_buses() -> None:
    assert any("--transport servicebus" in command for command in AGENT_EXAMPLES)
    assert any("--transport pubsub" in command for command in AGENT_EXAMPLES)


@pytest.mark.parametrize("command", AGENT_EXAMPLES)
def test_each_agent_example_has_every_setting_it_needs(clean_env: pytest.MonkeyPatch, command: str) -> None:
    argv = shlex.split(command)[1:]  # from `agent` on
    try:
        settings_from_args(build_parser("agent").parse_args(argv))
    except ConfigError as exc:
        pytest.fail(f"{command}\n  exits 2: {exc}")
