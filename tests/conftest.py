"""Fixtures shared by the whole suite: the real local peers the tests start, and the agent runner."""

pytest_plugins = ["tests.peers", "tests.peers_azurite", "tests.peers_firestore", "tests.agent_runner"]
