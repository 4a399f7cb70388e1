"""The configuration reference in docs/operations.md is generated from the one table of settings,
so what it says is what the agent reads; these tests fail when it is out of date."""

from __future__ import annotations

import os
import re

import pytest

from agent.config import SETTINGS
from mbridge.cli import main
from scripts.gen_config_reference import BEGIN, COMMAND, DOC, END, render, section


def test_the_reference_in_operations_md_is_up_to_date() -> None:
    document = DOC.read_text(encoding="utf-8")
    assert render(document) == document, f"docs/operations.md#configuration is out of date: run {COMMAND}"


def test_rendering_replaces_only_the_configuration_section() -> None:
    document = f"# Title\n\n## Configuration\n\n{BEGIN}\nold text\n{END}\n\n## Logs\n\nhand-written\n"
    rendered = render(document)
    assert rendered.startswith(f"# Title\n\n## Configuration\n\n{BEGIN}\n")
    assert rendered.endswith(f"{END}\n\n## Logs\n\nhand-written\n")
    assert "old text" not in rendered
    assert render(rendered) == rendered


def test_every_setting_has_one_row_with_its_three_names() -> None:
    rows = [line for line in section().splitlines() if line.startswith("| ") and "`--" in line]
    assert len(rows) == len(SETTINGS)
    for row, setting in zip(rows, SETTINGS):
        assert f"`{setting.flag}`" in row, row
        assert f"`{setting.env}`" in row, row
        if setting.in_file:
            assert f"| `{setting.key}` |" in row, row


def test_the_error_line_the_reference_shows_is_the_one_the_agent_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (shown,) = re.findall(r"^mbridge agent: .*$", section(), flags=re.MULTILINE)
    for name in list(os.environ):
        if name.startswith("MBRIDGE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("MBRIDGE_POLL_INTERVAL", "0.05")
    assert main(["agent", "--cloud", "azure", "--check"]) == 2
    assert capsys.readouterr().err.strip() == shown
