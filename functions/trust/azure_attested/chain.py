"""Step 5: the chain from the signer to a trusted root, with Azure's shipped issuing CAs, the
configured and embedded intermediates and, when none of them issued the signer, the certificate at
its caIssuers URL (`issuer_fetch`, at a bounded cost).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Callable

from cryptography import x509
from cryptography.x509 import verification

from functions.trust.azure_attested.errors import AttestationError
from functions.trust.azure_attested.issuer_cache import IssuerMemory
from functions.trust.azure_attested.issuer_fetch import fetch_signers_issuer, issued
from functions.trust.azure_attested.issuing_cas import azure_issuing_cas
from functions.trust.azure_attested.signed_data import SignedData

# Intermediates between the signer and its root: one today (signer -> Microsoft Azure RSA TLS
# Issuing CA 03 -> DigiCert Global Root G2), two in the newest hierarchy (-> Microsoft TLS G2 RSA
# CA OCSP 02 -> Microsoft TLS RSA Root G2 cross-signed -> DigiCert Global Root G2).
MAX_CHAIN_DEPTH = 3


def check_chain(
    signed: SignedData,
    name: str,
    roots: Sequence[x509.Certificate],
    intermediates: Sequence[x509.Certificate],
    valid_at: datetime,
    fetch_issuer: Callable[[str], bytes] | None,
    issuer_names: Collection[x509.Name],
    memory: IssuerMemory,
) -> None:
    pool = [*azure_issuing_cas(), *intermediates, *signed.others]
    notes = []
    if not any(issued(signed.signer, candidate) for candidate in pool):
        if fetch_issuer is None:
            notes.append("no known intermediate issued the signer and fetching it is off")
        else:
            pool.extend(fetch_signers_issuer(signed.signer, pool, fetch_issuer, issuer_names, memory))
    try:
        verifier = (
            verification.PolicyBuilder()
            .store(verification.Store(list(roots)))
            .time(valid_at)
            .max_chain_depth(MAX_CHAIN_DEPTH)
            .build_server_verifier(x509.DNSName(name))
        )
        verifier.verify(signed.signer, pool)
    except verification.VerificationError as exc:
        hint = "; ".join(notes) or "check the roots and intermediates"
        raise AttestationError(
            f"the signer certificate ({signed.signer.subject.rfc4514_string()}, issued by "
            f"{signed.signer.issuer.rfc4514_string()}) does not chain to a trusted root at {valid_at.isoformat()}: "
            f"{exc} ({hint})"
        ) from exc
    except (ValueError, TypeError) as exc:
        raise AttestationError(f"the certificate chain cannot be checked ({exc})") from exc
