"""Google's Firestore emulator, started by the test suite (see tests/peers.py for the rules)."""
