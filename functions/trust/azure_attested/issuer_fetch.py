"""Step 5, when no known CA issued the signer: its issuing CA from the caIssuers URL it names, at a
bounded cost whatever a forger puts in the certificate.

A forged signer costs its maker a certificate and us, at most, this:

- no fetch when the issuer it names is a CA we hold (that CA did not sign it: it is forged), or is
  none of Azure's issuing CAs (`azure_issuer_names`), or when fetching is off;
- else one fetch per message, of the first caIssuers URL on Microsoft's or DigiCert's host, and
  one per URL per interval across messages: the answer is remembered for a day, a failure for
  `FETCH_RETRY_AFTER` seconds (`IssuerMemory`);
- an answer that is not the issuer (4xx, oversized, no certificate, more than
  `MAX_FETCHED_CERTIFICATES`, certificates that did not sign the signer) refuses the document for
  good; only an unreachable URL or a 5xx raises `IssuerFetchError`, which the verifiers turn into
  a retry.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Callable
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.x509.oid import AuthorityInformationAccessOID

from functions.trust.azure_attested.certificates import CERT_ERRORS, load_certificates
from functions.trust.azure_attested.errors import AttestationError, IssuerFetchError, IssuerNotServedError
from functions.trust.azure_attested.issuer_cache import IssuerMemory
from functions.trust.azure_attested.signed_data import MAX_DOCUMENT_BYTES

# Hosts a signer's caIssuers URL may be fetched from: Microsoft's PKI repository (pki/mscorp and
# pkiops/certs on www.microsoft.com) and DigiCert's, where the cross-signed roots are published.
ISSUER_HOSTS = frozenset({"www.microsoft.com", "cacerts.digicert.com"})
# A caIssuers URL serves one certificate (DER); a PEM bundle of a few is accepted, no more.
MAX_FETCHED_CERTIFICATES = 4


def issued(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    if cert.issuer != issuer.subject:
        return False
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


def fetch_signers_issuer(
    signer: x509.Certificate,
    known: Sequence[x509.Certificate],
    fetch_issuer: Callable[[str], bytes],
    issuer_names: Collection[x509.Name],
    memory: IssuerMemory,
) -> list[x509.Certificate]:
    """The certificates at the signer's caIssuers URL, one of which issued the signer.

    Raises:
        AttestationError: the issuer is not to be fetched, or its URL's answer is not the issuer.
        IssuerFetchError: the URL could not be reached (now, or within the retry interval).
    """
    issuer = signer.issuer.rfc4514_string()
    if any(certificate.subject == signer.issuer for certificate in known):
        raise AttestationError(
            f"the signer certificate names {issuer} as its issuer, but that CA (which is known) did not sign it: "
            "it is not Azure's"
        )
    if signer.issuer not in issuer_names:
        raise AttestationError(
            f"the signer certificate's issuer {issuer} is none of Azure's issuing CAs, so it was not fetched; "
            "if Azure signs under a new one, add it to MBRIDGE_TRUST_INTERMEDIATES"
        )
    url = _first_allowed_url(signer)
    recalled = memory.recall(url)
    if recalled is None:
        certificates = _fetch(url, fetch_issuer, memory)
    elif recalled.failure is None:
        certificates = list(recalled.certificates)
    else:
        again = f"{recalled.failure} (not asked again for {memory.now() - recalled.asked_at:.0f} s)"
        raise IssuerFetchError(again) if recalled.retryable else AttestationError(again)
    if not any(issued(signer, certificate) for certificate in certificates):
        raise AttestationError(f"{url} did not serve the signer's issuer ({issuer}): the signer is not Azure's")
    return certificates


def _first_allowed_url(signer: x509.Certificate) -> str:
    """The first caIssuers URL that may be fetched: one per message, however many it lists."""
    try:
        access = signer.extensions.get_extension_for_class(x509.AuthorityInformationAccess).value
    except x509.ExtensionNotFound:
        raise AttestationError("the signer certificate names no caIssuers URL to fetch its issuer from") from None
    except CERT_ERRORS as exc:
        raise AttestationError(f"the signer certificate's extensions do not parse ({exc})") from exc
    refusals = []
    for description in access:
        if description.access_method != AuthorityInformationAccessOID.CA_ISSUERS or not isinstance(
            description.access_location, x509.UniformResourceIdentifier
        ):
            continue
        url = str(description.access_location.value)
        refusal = _url_refusal(url)
        if refusal is None:
            return url
        refusals.append(refusal)
    raise AttestationError(
        "; ".join(refusals) or "the signer certificate names no caIssuers URL to fetch its issuer from"
    )


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


def _fetch(url: str, fetch_issuer: Callable[[str], bytes], memory: IssuerMemory) -> list[x509.Certificate]:
    try:
        data = fetch_issuer(url)
    except IssuerNotServedError as exc:
        raise _refused(memory, url, f"{url} did not serve the signer's issuing CA: {exc}") from exc
    except Exception as exc:  # whatever the caller's HTTP client raises: the issuer is unreachable
        failure = f"the signer's issuing CA could not be fetched from {url}: {exc}"
        memory.remember_failure(url, failure, retryable=True)
        raise IssuerFetchError(failure) from exc
    if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_DOCUMENT_BYTES:
        raise _refused(memory, url, f"{url} did not answer with one certificate (DER or PEM, at most 64 KiB)")
    try:
        certificates = load_certificates(bytes(data))
    except AttestationError as exc:
        raise _refused(memory, url, f"{url}: {exc}") from exc
    if len(certificates) > MAX_FETCHED_CERTIFICATES:
        raise _refused(
            memory, url, f"{url} answered with {len(certificates)} certificates, more than {MAX_FETCHED_CERTIFICATES}"
        )
    memory.remember_answer(url, certificates)
    return certificates


def _refused(memory: IssuerMemory, url: str, failure: str) -> AttestationError:
    memory.remember_failure(url, failure, retryable=False)
    return AttestationError(failure)
