"""A stand-in for the `IdentityVerifier` port in tests of what uses it (process, mbridge approve), and
the real proofs of a simulated VM's agent (`proven_by_metadata`).

It behaves as the real verifiers do (functions/trust/verifiers.py, tested on their own against the
simulator's real proofs): a proof names one VM and is bound to the digest of the message it was
made for, so a proof moved to another message, or a message changed after it was proven, fails.
"""

from __future__ import annotations

import json
from datetime import datetime

from cryptography import x509
from cryptography.x509.oid import NameOID

from agent.proofs import AzureAttestedProver, GceIdentityProver
from agent.sources.azure.client import AzureImdsClient
from agent.sources.gce.client import GceMetadataClient
from wire.envelope import Envelope, encode
from wire.identity import DEFAULT_AUDIENCE, GCE_TOKEN, Identity, ProofBinding, UnverifiedError
from wire.model import Cloud


class ProofsOfTest:
    def verify(self, envelope: Envelope, accepted_at: datetime, now: datetime) -> Identity:
        proof = envelope.extensions.get(GCE_TOKEN)
        parts = proof.split("|") if isinstance(proof, str) else []
        if len(parts) not in (2, 4):
            raise UnverifiedError("no proof of identity")
        vm, digest = parts[:2]
        if digest != envelope.digest:
            raise UnverifiedError("the proof was made for another message")
        # An Azure-like proof: a document issued for one key, which signs the message.
        binding = ProofBinding(f"document|{parts[2]}", parts[3]) if len(parts) == 4 else None
        return Identity(vm=vm, how="attested", binding=binding)


def proven(envelope: Envelope, by: str, document: str = "", key: str = "") -> bytes:
    """The message as agent `by` publishes it: its proof bound to this very message; with a
    `document` and `key`, an Azure-like proof (a document issued for that key)."""
    document_json = json.loads(encode(envelope))
    proof = f"{by}|{envelope.digest}" + (f"|{document}|{key}" if document else "")
    document_json[GCE_TOKEN] = proof
    return json.dumps(document_json).encode()


def proven_by_metadata(cloud: Cloud, url: str, body: bytes) -> bytes:
    """The message as the agent of the VM behind `url` (a simulator's) publishes it: its proof made
    by its metadata service now, with the cloud's real signatures."""
    if cloud is Cloud.AZURE:
        azure = AzureImdsClient.for_base_url(url)
        try:
            return AzureAttestedProver(azure, lambda: 0.0).prove(body)
        finally:
            azure.close()
    gce = GceMetadataClient.for_base_url(url)
    try:
        return GceIdentityProver(gce, DEFAULT_AUDIENCE).prove(body)
    finally:
        gce.close()


def microsoft_name(common_name: str) -> x509.Name:
    """An issuer name as Microsoft's issuing CAs carry it (what a forger puts in its signer certificate)."""
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Microsoft Corporation"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )
