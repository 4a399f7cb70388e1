"""Azure's issuing CAs, shipped with the code (`azure_cas/`, where each one's origin is recorded),
and the names of those a signer's issuer may be fetched for.

With the shipped CAs a genuine document verifies without a fetch. The names bound what a forged
signer can make the verifier fetch: a signer naming any other issuer is refused at once.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from functions.trust.azure_attested.certificates import load_certificates

_BUNDLE = Path(__file__).with_name("azure_cas")

# Issuing CAs Microsoft lists for Azure's TLS and IMDS attested-data signers whose certificates
# are not shipped (azure_cas/README.md): they may be fetched from the signer's caIssuers URL.
_LISTED_NOT_SHIPPED = tuple(f"Microsoft TLS G2 RSA CA OCSP {number:02d}" for number in range(6, 17, 2))


@lru_cache(maxsize=1)
def azure_issuing_cas() -> tuple[x509.Certificate, ...]:
    """The shipped issuing CAs (helpers for building a chain; none of them is trusted as a root)."""
    return tuple(load_certificates((_BUNDLE / "issuing_cas.pem").read_bytes()))


@lru_cache(maxsize=1)
def azure_extra_roots() -> tuple[x509.Certificate, ...]:
    """The roots Azure's signers chain to that certifi does not hold (Microsoft TLS RSA Root G2)."""
    return tuple(load_certificates((_BUNDLE / "roots.pem").read_bytes()))


@lru_cache(maxsize=1)
def azure_issuer_names() -> frozenset[x509.Name]:
    """The issuer names a signer's issuing CA may be fetched for: the shipped CAs' and the others
    Microsoft lists, each as Microsoft writes it (C=US, O=Microsoft Corporation, CN=...)."""
    listed = {certificate.subject for certificate in azure_issuing_cas()}
    listed.update(_microsoft_name(common_name) for common_name in _LISTED_NOT_SHIPPED)
    return frozenset(listed)


def _microsoft_name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Microsoft Corporation"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )
