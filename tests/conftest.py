"""Fixtures shared by the whole suite: the real local peers of tests/peers.py."""

pytest_plugins = ["tests.peers"]
