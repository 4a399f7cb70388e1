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


def test_import_rss_describes_the_libraries_share() -> None:
    text = ImportRss(interpreter_mb=10.8, http_mb=27.8, agent_mb=31.6).describe()
    assert "31.6 MB" in text
    assert "bare interpreter 10.8 MB" in text
    assert "add 17.0 MB" in text


def test_import_rss_names_the_cryptography_share_when_it_was_measured() -> None:
    text = ImportRss(interpreter_mb=10.8, http_mb=27.8, agent_mb=39.3, crypto_mb=34.5).describe()
    assert "39.3 MB" in text
    assert (
        "add 17.0 MB; cryptography's Ed25519, for the proofs of identity and the commands' signatures, 6.7 MB more"
        in text
    )
