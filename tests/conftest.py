"""Fixtures shared by the whole suite: the real local peers the tests start themselves."""

pytest_plugins = ["tests.peers", "tests.peers_azurite", "tests.peers_firestore"]
