"""The import probe's output, and what it says."""

from __future__ import annotations

import json

import pytest

from bench.agent_probes import ImportRss, parse_import_steps


def test_import_steps_are_the_rss_after_each_group() -> None:
    output = json.dumps([["interpreter", 10.5], ["requests,http.server", 27.5], ["mbridge.cli,agent.main", 31.25]])
    assert parse_import_steps(output) == [10.5, 27.5, 31.25]


def test_import_steps_need_the_interpreter_and_two_groups() -> None:
    with pytest.raises(ValueError, match="steps"):
        parse_import_steps(json.dumps([["interpreter", 10.5]]))


def test_import_rss_gives_what_each_step_added_and_the_idle_total() -> None:
    after = {"interpreter": 10.8, "sqlite3": 11.6, "http": 26.0, "agent": 29.5, "cryptography": 37.9}
    imports = ImportRss(after)
    assert imports.cost("interpreter") == pytest.approx(10.8)
    assert imports.cost("http") == pytest.approx(14.4)
    assert imports.cost("cryptography") == pytest.approx(8.4)
    assert imports.idle_mb == pytest.approx(29.5)  # cryptography is not loaded before the first use
    text = imports.describe()
    assert "has 29.5 MB resident" in text
    assert "http.client with ssl 14.4" in text
    assert "adds 8.4 MB" in text
