"""A crash, for tests that kill an invocation or a process at a chosen point."""

from __future__ import annotations


class Killed(BaseException):
    """The host killed the invocation: nothing of it runs after this, not even an `except Exception`
    that would give a claim back."""
