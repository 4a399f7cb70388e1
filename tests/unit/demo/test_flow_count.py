"""How many flows the demo plays is said in one place only: the flows it defines. The command line
and the docs either say nothing of the count or say that number, so they cannot disagree again
(`mbridge --help` once said eight while the README said ten, and the demo played twelve)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mbridge.demo
from mbridge.cli import build_parser, main
from mbridge.demo.flows import FLOWS

ROOT = Path(__file__).resolve().parents[3]
WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
WORDS += ["eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen"]
# "twelve flows", "12 maintenance flows", "the same eight flows": a count of the flows as a whole.
COUNT = re.compile(r"\b(\d+|" + "|".join(WORDS) + r")\s+(?:maintenance\s+)?flows\b", re.IGNORECASE)


def stated_counts(text: str) -> list[int]:
    found = [match.group(1).lower() for match in COUNT.finditer(text)]
    return [int(word) if word.isdigit() else WORDS.index(word) + 1 for word in found]


def test_the_count_is_read_whatever_way_it_is_written() -> None:
    assert stated_counts("then twelve flows, time-scaled; on 8 maintenance\n  flows; the Same Eight flows") == [
        12,
        8,
        8,
    ]
    assert stated_counts("every flow; the flows; a 5 s Freeze") == []


def test_mbridge_help_states_no_count_that_differs_from_the_flows() -> None:
    text = build_parser().format_help()

    assert "demo" in text
    assert set(stated_counts(text)) <= {len(FLOWS)}


def test_mbridge_demo_help_says_how_many_flows_it_plays(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--help"])

    assert exited.value.code == 0
    assert stated_counts(capsys.readouterr().out) == [len(FLOWS)]


@pytest.mark.parametrize("path", ["README.md", "docs/demo.md", "mbridge/demo/__init__.py"])
def test_the_docs_state_no_count_that_differs_from_the_flows(path: str) -> None:
    text = (mbridge.demo.__doc__ or "") if path.endswith(".py") else (ROOT / path).read_text(encoding="utf-8")

    assert set(stated_counts(text)) <= {len(FLOWS)}, path
