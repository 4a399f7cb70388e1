"""The simulated project every GCE VM of the simulator belongs to: its ids, zone and instance ids.

The identity tokens, the metadata tree and the tests that check a token's claims all need the same
values, so they are stated once here.
"""

from __future__ import annotations

import hashlib

PREFIX = "/computeMetadata/v1/"
PROJECT_ID = "maintenance-bridge-sim"
PROJECT_NUMBER = str(10**11 + int(hashlib.sha256(PROJECT_ID.encode()).hexdigest(), 16) % (9 * 10**11))
ZONE = "us-central1-a"


def instance_id(vm: str) -> str:
    """A stable 19-digit numeric id derived from the name (GCE ids are unsigned 64-bit numbers)."""
    return str(10**18 + int(hashlib.sha256(vm.encode()).hexdigest(), 16) % (9 * 10**18))
