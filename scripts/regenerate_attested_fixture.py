"""Rewrite tests/fixtures/azure/attested/: an IMDS attested document in the real format, and the
certificates to verify it with.

The simulator's authority (simulator/attestation.py) makes a new PKI (root CA, intermediate
CA, metadata.azure.com signer) valid around a fixed time, and signs the document the simulator's
default Azure VM gets for `GET /metadata/attested/document?api-version=2020-09-01&nonce=1234567890`
at that time. The keys are new at every run, so all three files change together; the signed
content does not.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.attestation import AttestationAuthority  # noqa: E402
from simulator.azure_api import SIM_LOCATION, SIM_SUBSCRIPTION_ID, vm_id  # noqa: E402

TARGET = ROOT / "tests" / "fixtures" / "azure" / "attested"
CREATED_ON = datetime(2026, 1, 15, 12, 0, 0, tzinfo=timezone.utc)
VM_NAME = "vm-0"
NONCE = "1234567890"


def main() -> int:
    authority = AttestationAuthority.generate(CREATED_ON, region=SIM_LOCATION)
    answer = authority.sign(vm_id(VM_NAME), SIM_SUBSCRIPTION_ID, NONCE, CREATED_ON)
    TARGET.mkdir(parents=True, exist_ok=True)
    # The body as IMDS sends it: compact JSON on one line.
    (TARGET / "document.json").write_text(json.dumps(answer, separators=(",", ":")) + "\n", encoding="ascii")
    (TARGET / "roots.pem").write_bytes(authority.roots_pem())
    (TARGET / "intermediates.pem").write_bytes(authority.intermediates_pem())
    print(f"wrote document.json, roots.pem and intermediates.pem in {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
