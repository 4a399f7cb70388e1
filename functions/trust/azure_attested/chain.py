"""Step 5: the chain from the signer to a trusted root, with the known and embedded intermediates
and, when none of them issued the signer, the certificate at its caIssuers URL (allowed hosts only).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Callable
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.x509 import verification
from cryptography.x509.oid import AuthorityInformationAccessOID

from functions.trust.azure_attested.certificates import CERT_ERRORS, load_certificates
from functions.trust.azure_attested.errors import AttestationError, IssuerFetchError
from functions.trust.azure_attested.issuer_cache import cached, remember
from functions.trust.azure_attested.signed_data import MAX_DOCUMENT_BYTES, SignedData

# Hosts a signer's caIssuers URL may be fetched from: Microsoft's PKI repository (pki/mscorp and
# pkiops/certs on www.microsoft.com) and DigiCert's, where the cross-signed roots are published.
ISSUER_HOSTS = frozenset({"www.microsoft.com", "cacerts.digicert.com"})


def check_chain(
    signed: SignedData,
    name: str,
    roots: Sequence[x509.Certificate],
    intermediates: Sequence[x509.Certificate],
    valid_at: datetime,
    fetch_issuer: Callable[[str], bytes] | None,
) -> None:
    pool = [*intermediates, *signed.others]
    notes = []
    if not any(_issued(signed.signer, candidate) for candidate in pool):
        if fetch_issuer is None:
            notes.append("no known intermediate issued the signer and fetching it is off")
        else:
            fetched, why = _fetch_issuers(signed.signer, fetch_issuer)
            pool.extend(fetched)
            notes.extend(why)
    try:
        verifier = (
            verification.PolicyBuilder()
            .store(verification.Store(list(roots)))
            .time(valid_at)
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


def _issued(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    if cert.issuer != issuer.subject:
        return False
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


def _fetch_issuers(
    signer: x509.Certificate, fetch_issuer: Callable[[str], bytes]
) -> tuple[list[x509.Certificate], list[str]]:
    """The certificates at the signer's allowed caIssuers URLs, and notes on what was not fetched."""
    try:
        access = signer.extensions.get_extension_for_class(x509.AuthorityInformationAccess).value
    except x509.ExtensionNotFound:
        return [], ["the signer certificate names no caIssuers URL to fetch its issuer from"]
    except CERT_ERRORS as exc:
        raise AttestationError(f"the signer certificate's extensions do not parse ({exc})") from exc
    urls = [
        str(d.access_location.value)
        for d in access
        if d.access_method == AuthorityInformationAccessOID.CA_ISSUERS
        and isinstance(d.access_location, x509.UniformResourceIdentifier)
    ]
    if not urls:
        return [], ["the signer certificate names no caIssuers URL to fetch its issuer from"]
    fetched: list[x509.Certificate] = []
    notes = []
    for url in urls:
        refusal = _url_refusal(url)
        if refusal is not None:
            notes.append(refusal)
            continue
        certificates = cached(url)
        if certificates is None or not any(_issued(signer, c) for c in certificates):
            certificates = _fetch(url, fetch_issuer)
            remember(url, certificates)
        fetched.extend(certificates)
        if any(_issued(signer, c) for c in certificates):
            break
        notes.append(f"{url} did not serve the signer's issuer")
    return fetched, notes


def _url_refusal(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return f"the caIssuers URL {url!r} does not parse, so it was not fetched"
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or parts.username is not None or parts.password is not None:
        return f"the caIssuers URL {url!r} is not plain http(s), so it was not fetched"
    if host not in ISSUER_HOSTS or port not in (None, 80 if parts.scheme == "http" else 443):
        return f"the caIssuers URL {url!r} is not on {sorted(ISSUER_HOSTS)}, so it was not fetched"
    return None


def _fetch(url: str, fetch_issuer: Callable[[str], bytes]) -> list[x509.Certificate]:
    try:
        data = fetch_issuer(url)
    except Exception as exc:  # whatever the caller's HTTP client raises: the issuer is unreachable
        raise IssuerFetchError(f"the signer's issuing CA could not be fetched from {url}: {exc}") from exc
    if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_DOCUMENT_BYTES:
        raise AttestationError(f"{url} did not answer with one certificate (DER or PEM, at most 64 KiB)")
    return load_certificates(bytes(data))
