"""Rewrite tests/fixtures/gce/identity/: an instance identity token in the real format, and the
certificates to verify it with.

The simulator's issuer (simulator/gce_identity.py) makes new keys, and signs one format=full
token for the simulator's default GCE VM at a fixed time, with the documented claim set. The keys
are new at every run, so token.jwt and certs.json always change together; the claims do not.
"""

from __future__ import annotations

import hashlib
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.gce_api import PROJECT_ID, PROJECT_NUMBER, ZONE, instance_id  # noqa: E402
from simulator.gce_identity import TokenIssuer  # noqa: E402

TARGET = ROOT / "tests" / "fixtures" / "gce" / "identity"
ISSUED_AT = datetime(2025, 6, 2, 12, 0, 0, tzinfo=timezone.utc)
CREATED_AT = datetime(2025, 6, 2, 9, 30, 0, tzinfo=timezone.utc)  # the VM's creation
VM_NAME = "gce-vm-0"
# A deployment's audience followed by a message digest, the form such an audience takes.
AUDIENCE = "maintenance-bridge/" + hashlib.sha256(b"identity fixture").hexdigest()


def main() -> int:
    issuer = TokenIssuer.generate(now=CREATED_AT)
    token = issuer.issue(
        AUDIENCE,
        instance_name=VM_NAME,
        instance_id=instance_id(VM_NAME),
        project_id=PROJECT_ID,
        project_number=PROJECT_NUMBER,
        zone=ZONE,
        full=True,
        now=ISSUED_AT,
        instance_creation_timestamp=int(CREATED_AT.timestamp()),
    )
    TARGET.mkdir(parents=True, exist_ok=True)
    # The body exactly as the metadata server sends it: the token, no newline.
    (TARGET / "token.jwt").write_text(token, encoding="ascii")
    (TARGET / "certs.json").write_text(json.dumps(issuer.certs(), indent=2) + "\n", encoding="ascii")
    print(f"wrote {TARGET / 'token.jwt'} and {TARGET / 'certs.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
