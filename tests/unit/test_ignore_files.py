"""The upload ignore files keep exactly what scripts/build_function_package.py packages."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.build_function_package import APP_FILES, PACKAGES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("ignore_file", [".gcloudignore", ".funcignore"])
def test_uploads_leave_the_workspace_behind_and_keep_the_app(ignore_file: str) -> None:
    patterns = {
        line.strip().rstrip("/")
        for line in (ROOT / ignore_file).read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }

    assert {".git", ".venv*", "node_modules", "tests", "infra", "__pycache__"} <= patterns
    assert not patterns & set(APP_FILES)
    assert not patterns & set(PACKAGES)
