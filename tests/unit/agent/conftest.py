"""Fixtures of the agent's unit tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No MBRIDGE_* variable but those the test sets: the machine's own must not leak in."""
    for name in list(os.environ):
        if name.startswith("MBRIDGE_"):
            monkeypatch.delenv(name)
    return monkeypatch
