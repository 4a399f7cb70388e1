"""Azure IMDS attested documents: check one and say which VM it speaks for.

A VM gets `{"encoding": "pkcs7", "signature": <base64>}` from
`/metadata/attested/document`; the signature is a DER CMS SignedData (RFC 5652) that embeds the
signed JSON (vmId, subscriptionId, nonce, timeStamp, ...) and one certificate, the signer's. Its
issuer, a Microsoft intermediate CA, is not embedded: it is named by the signer certificate's
Authority Information Access (caIssuers URL), and chains to a public root (DigiCert Global Root G2;
since 2026 also Microsoft TLS RSA Root G2, self-signed or cross-signed by DigiCert).

`verify_attested_document` checks, in order, and raises `AttestationError` at the first failure:

1. base64, at most `MAX_DOCUMENT_BYTES` (refused before any parsing);
2. a CMS SignedData (asn1crypto parses it) with embedded `data` content, the versions RFC 5652
   gives its fields, and exactly one SignerInfo whose certificate is among the embedded ones;
3. the signature (cryptography verifies it): over the content itself when there are no signed
   attributes (what Azure sends), or else over the DER of the signed attributes as a SET OF after
   checking their contentType and messageDigest against the content;
4. the signer's name: a DNS name of its SubjectAltName equal to one of `signer_names` or a
   subdomain of one (IMDS's guidance: "accept any subdomain", e.g. eastus.metadata.azure.com);
5. the chain from the signer to one of `roots`, valid at `valid_at`, at most `MAX_CHAIN_DEPTH`
   intermediates long, with Azure's issuing CAs shipped in `azure_cas/`, `intermediates`, the
   other embedded certificates (at most `MAX_EMBEDDED_CERTIFICATES` in all) and, when none of
   them issued the signer and `fetch_issuer` is given, the certificate at the signer's caIssuers
   URL: only for an issuer named in `issuer_names` (Azure's) that no known CA bears, only the first
   http(s) URL on `ISSUER_HOSTS`, and what it gave, certificates or failure, remembered per URL
   (`IssuerMemory`), so a forged document costs at most one fetch, and a storm of them one per
   URL per `FETCH_RETRY_AFTER` seconds;
6. the content: JSON with non-empty string `vmId` and `subscriptionId`, a string `nonce`, and
   `timeStamp` {createdOn, expiresOn} ("MM/DD/YY HH:MM:SS -0000", UTC) with
   createdOn - `CLOCK_SKEW` <= `valid_at` <= expiresOn.

The chain is checked by cryptography's *server* verifier, built for the DNS name step 4 found in
the certificate. Why not the client verifier: every Azure signer certificate seen so far carries
extended key usage serverAuth (with clientAuth), and serverAuth is what every other verifier of
these documents requires (Go's x509 default); clientAuth is being withdrawn from publicly trusted
TLS certificates, and the client verifier would refuse a signer (or an intermediate) without it.
Why the name comes from our own check: the server verifier matches one exact name, while the IMDS
documentation says certificates may carry only regional names, so any subdomain must be accepted.
Revocation (CRL, OCSP) is not checked; a signer certificate lives a year, a document six hours.

The steps live in their own modules: signed_data (1, 2), signer (3, 4), chain, issuing_cas,
issuer_fetch and issuer_cache (5), claims (6); verify holds the entry point. The names the
verifiers, the apps and the tests use are exported here.
"""

from __future__ import annotations

from functions.trust.azure_attested.certificates import load_certificates
from functions.trust.azure_attested.chain import MAX_CHAIN_DEPTH
from functions.trust.azure_attested.claims import CLOCK_SKEW, TIMESTAMP_FORMAT, AttestedDocument
from functions.trust.azure_attested.errors import (
    AttestationError,
    DocumentExpiredError,
    IssuerFetchError,
    IssuerNotServedError,
)
from functions.trust.azure_attested.issuer_cache import (
    FETCH_RETRY_AFTER,
    ISSUER_CACHE_SIZE,
    IssuerMemory,
    clear_issuer_cache,
)
from functions.trust.azure_attested.issuer_fetch import ISSUER_HOSTS, MAX_FETCHED_CERTIFICATES
from functions.trust.azure_attested.issuing_cas import azure_extra_roots, azure_issuer_names, azure_issuing_cas
from functions.trust.azure_attested.signed_data import MAX_DOCUMENT_BYTES, MAX_EMBEDDED_CERTIFICATES
from functions.trust.azure_attested.verify import DEFAULT_SIGNER_NAMES, verify_attested_document

__all__ = [
    "CLOCK_SKEW",
    "DEFAULT_SIGNER_NAMES",
    "FETCH_RETRY_AFTER",
    "ISSUER_CACHE_SIZE",
    "ISSUER_HOSTS",
    "MAX_CHAIN_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_EMBEDDED_CERTIFICATES",
    "MAX_FETCHED_CERTIFICATES",
    "TIMESTAMP_FORMAT",
    "AttestationError",
    "AttestedDocument",
    "DocumentExpiredError",
    "IssuerFetchError",
    "IssuerMemory",
    "IssuerNotServedError",
    "azure_extra_roots",
    "azure_issuer_names",
    "azure_issuing_cas",
    "clear_issuer_cache",
    "load_certificates",
    "verify_attested_document",
]
