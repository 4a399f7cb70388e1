"""Fixtures shared by the whole suite: the real local peers the tests start, the agent runner, and the
root logger put back after each test."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.peers", "tests.peers_azurite", "tests.peers_firestore", "tests.agent_runner"]


@pytest.fixture(autouse=True)
def _root_logger_as_it_was() -> Iterator[None]:
    """`mbridge agent` run in-process (agent.logs.configure) points the root logger at the sys.stderr of
    that moment, which is the test's captured stream: left in place, every later test's log line would
    be written to a closed file, and logging prints its own error in that test's stderr."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
