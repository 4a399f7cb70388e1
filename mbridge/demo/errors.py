"""The demo's own error, apart so that the backbones and tests/peers.py can raise and catch it
without importing the command line."""

from __future__ import annotations


class DemoSetupError(Exception):
    """A peer the chosen variant needs is missing; the message says how to get it."""
