"""Polling helpers for tests that watch something happen in another thread or process."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(condition: Callable[[], bool], timeout: float, what: str | Callable[[], str]) -> None:
    """Return as soon as `condition()` holds; fail after `timeout` seconds describing `what`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            detail = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout} s waiting for {detail}")
        time.sleep(0.05)
