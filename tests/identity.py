"""A stand-in for the `IdentityVerifier` port in tests of what uses it (process, mbridge approve).

It behaves as the real verifiers do (functions/trust/verifiers.py, tested on their own against the
simulator's real proofs): a proof names one VM and is bound to the digest of the message it was
made for, so a proof moved to another message, or a message changed after it was proven, fails.
"""

from __future__ import annotations

import json
from datetime import datetime

from wire.envelope import Envelope, encode
from wire.identity import GCE_TOKEN, Identity, UnverifiedError


class ProofsOfTest:
    def verify(self, envelope: Envelope, accepted_at: datetime, now: datetime) -> Identity:
        proof = envelope.extensions.get(GCE_TOKEN)
        if not isinstance(proof, str) or proof.count("|") != 1:
            raise UnverifiedError("no proof of identity")
        vm, digest = proof.split("|")
        if digest != envelope.digest:
            raise UnverifiedError("the proof was made for another message")
        return Identity(vm=vm, how="attested")


def proven(envelope: Envelope, by: str) -> bytes:
    """The message as agent `by` publishes it: its proof bound to this very message."""
    document = json.loads(encode(envelope))
    document[GCE_TOKEN] = f"{by}|{envelope.digest}"
    return json.dumps(document).encode()
