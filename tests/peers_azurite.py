"""The Azurite Table service, started by the test suite (see tests/peers.py for the rules)."""
