"""wire/version.py: the release the tools report is the installed distribution's."""

from __future__ import annotations

import re
from pathlib import Path

from wire.version import UNKNOWN, version

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_the_one_pyproject_declares() -> None:
    # GIVEN the project installed from this tree (make venv installs it editable)
    declared = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert declared is not None
    # THEN the reported version is that one, never the fallback
    assert version() == declared.group(1)
    assert version() != UNKNOWN
