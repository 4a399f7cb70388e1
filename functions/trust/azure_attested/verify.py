"""`verify_attested_document`: the six steps of checking one attested document, in order.

The steps are in their own modules; this one holds the entry point and its arguments.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timezone
from typing import Callable

from cryptography import x509

from functions.trust.azure_attested.chain import check_chain
from functions.trust.azure_attested.claims import AttestedDocument, read_content
from functions.trust.azure_attested.errors import AttestationError
from functions.trust.azure_attested.issuer_cache import IssuerMemory, shared_issuer_memory
from functions.trust.azure_attested.issuing_cas import azure_issuer_names
from functions.trust.azure_attested.signed_data import decode, parse
from functions.trust.azure_attested.signer import check_signature, signer_name

DEFAULT_SIGNER_NAMES = ("metadata.azure.com",)  # public cloud; .us, .cn, microsoftazure.de elsewhere


def verify_attested_document(
    signature_b64: str,
    *,
    roots: Sequence[x509.Certificate],
    intermediates: Sequence[x509.Certificate] = (),
    signer_names: Sequence[str] = DEFAULT_SIGNER_NAMES,
    valid_at: datetime,
    fetch_issuer: Callable[[str], bytes] | None = None,
    issuer_names: Collection[x509.Name] | None = None,
    issuer_memory: IssuerMemory | None = None,
) -> AttestedDocument:
    """Check an IMDS attested document's `signature` and return what it attests.

    Args:
        signature_b64: the `signature` field of the IMDS answer (base64 of DER PKCS#7).
        roots: the trusted roots (for Azure: DigiCert Global Root G2, Microsoft TLS RSA Root G2).
        intermediates: issuing CAs known beforehand, besides Azure's shipped ones (saves fetching).
        signer_names: names the signer certificate must carry (or a subdomain of one).
        valid_at: the moment the document must be valid at (timezone-aware), e.g. when the
            message carrying it was accepted.
        fetch_issuer: url -> the certificate there (DER or PEM); called for the signer's
            caIssuers URL when no known CA issued the signer, the issuer it names is in
            `issuer_names` and no known CA bears that name, on allowed hosts only, once per URL
            per interval. It raises `IssuerNotServedError` for an answer that is not the
            certificate (HTTP 4xx), anything else when the URL cannot be reached.
        issuer_names: the issuers that may be fetched (default: Azure's issuing CAs).
        issuer_memory: what each URL gave (default: the process's, on the monotonic clock).

    Raises:
        AttestationError: the document is not valid proof at `valid_at` (IssuerFetchError when
            the issuing CA could not be reached: the same document may verify later).
    """
    if valid_at.tzinfo is None:
        raise AttestationError(f"valid_at must be timezone-aware, got naive {valid_at.isoformat()}")
    moment = valid_at.astimezone(timezone.utc)
    if not roots:
        raise AttestationError("no trusted roots were given; configure the Azure roots (DigiCert Global Root G2)")
    raw = decode(signature_b64)
    signed = parse(raw)
    check_signature(signed)
    name = signer_name(signed.signer, signer_names)
    check_chain(
        signed,
        name,
        roots,
        intermediates,
        moment,
        fetch_issuer,
        azure_issuer_names() if issuer_names is None else issuer_names,
        shared_issuer_memory() if issuer_memory is None else issuer_memory,
    )
    return read_content(signed.content, name, moment)
