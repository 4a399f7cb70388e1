"""The docs' commands name a virtualenv the reader can have: `make demo` builds `.venv-demo` (only
what the demo imports) and `make venv` builds `.venv` (everything the tests and tools need). A
command run from one says, in its section, how to get it; and what is run from `.venv-demo`
imports nothing the demo extra does not install."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMPORT_GUARD = ROOT / "tests" / "e2e" / "import_guard.py"
DOCS = ["README.md", *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def makefile_value(name: str) -> str:
    match = re.search(rf"^{name} \?= (\S+)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE)
    assert match is not None, name
    return match.group(1)


VENV, DEMO_VENV = makefile_value("VENV"), makefile_value("DEMO_VENV")
# How each is got, as the docs must say it (Makefile targets).
GOT_BY = {VENV: ("make venv",), DEMO_VENV: ("make demo", "make demo-venv")}


def sections(text: str) -> list[str]:
    """The text under each heading (a `#` line inside a code block is a comment, not a heading)."""
    found, fenced = [""], False
    for line in text.splitlines(keepends=True):
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"#+ ", line):
            found.append("")
        found[-1] += line
    return found


def commands_from(venv: str, section: str) -> list[str]:
    """The commands of the section's code blocks that run a program of `venv`."""
    prefix = f"{venv}/bin/"
    return [
        line.strip()
        for block in FENCE.findall(section)
        for line in block.replace("\\\n", " ").splitlines()
        if prefix in line and not line.lstrip().startswith("#")
    ]


def test_both_virtualenvs_have_a_target_that_builds_them_alone() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^venv: \$\(VENV\)/\.installed$", makefile, re.MULTILINE)
    assert re.search(r"^demo-venv: \$\(DEMO_VENV\)/\.installed$", makefile, re.MULTILINE)


@pytest.mark.parametrize("path", DOCS)
def test_a_command_run_from_a_virtualenv_says_how_to_get_it(path: str) -> None:
    for section in sections((ROOT / path).read_text(encoding="utf-8")):
        for venv, ways in GOT_BY.items():
            if commands_from(venv, section):
                assert any(way in section for way in ways), f"{path}: section {section.splitlines()[0]!r} runs {venv}"


@pytest.mark.parametrize("path", DOCS)
def test_no_doc_says_make_demo_builds_the_full_virtualenv(path: str) -> None:
    text = (ROOT / path).read_text(encoding="utf-8")

    assert not re.search(rf"make demo[^\n]*builds `?{re.escape(VENV)}`?[\s,)]", text), path


def demo_venv_subcommands() -> list[str]:
    found = set()
    for path in DOCS:
        for section in sections((ROOT / path).read_text(encoding="utf-8")):
            for command in commands_from(DEMO_VENV, section):
                after = command.split(f"{DEMO_VENV}/bin/mbridge ", 1)
                if len(after) == 2:
                    found.add(after[1].split()[0])
    return sorted(found)


def test_the_docs_run_the_product_from_the_demo_virtualenv() -> None:
    assert {"demo", "simulate", "agent", "replay"} <= set(demo_venv_subcommands())


@pytest.mark.skipif(
    sys.version_info < (3, 10),
    reason="the import guard lists the standard library with sys.stdlib_module_names (3.10+)",
)
@pytest.mark.parametrize("subcommand", demo_venv_subcommands())
def test_what_the_docs_run_from_the_demo_virtualenv_needs_only_the_demo_extra(subcommand: str) -> None:
    done = subprocess.run(
        [sys.executable, str(IMPORT_GUARD), "demo", "mbridge.cli", subcommand, "--help"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
