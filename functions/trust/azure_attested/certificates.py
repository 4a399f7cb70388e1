"""Loading X.509 certificates (PEM bundles, DER) with every field the checks read parsed up front.

cryptography parses lazily; parsing here turns a malformed certificate into an AttestationError at
load time instead of an unexpected exception in the middle of a check.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm

from functions.trust.azure_attested.errors import AttestationError

CERT_ERRORS = (
    ValueError,
    TypeError,
    UnsupportedAlgorithm,
    x509.InvalidVersion,
    x509.DuplicateExtension,
    x509.UnsupportedGeneralNameType,
)


def load_certificates(pem_or_der: bytes) -> list[x509.Certificate]:
    """Certificates from a PEM bundle (one or more) or from one DER certificate."""
    if not isinstance(pem_or_der, (bytes, bytearray)):
        raise AttestationError(f"certificates must be bytes (PEM or DER), got {type(pem_or_der).__name__}")
    data = bytes(pem_or_der)
    try:
        if b"-----BEGIN" in data:
            return [_parsed(cert) for cert in x509.load_pem_x509_certificates(data)]
        return [_parsed(x509.load_der_x509_certificate(data))]
    except CERT_ERRORS as exc:
        raise AttestationError(
            f"not a PEM bundle of certificates nor one DER certificate ({exc}); check the file or URL"
        ) from exc


def load_certificate(der: bytes) -> x509.Certificate:
    try:
        return _parsed(x509.load_der_x509_certificate(der))
    except CERT_ERRORS as exc:
        raise AttestationError(f"an embedded certificate does not parse ({exc})") from exc


def _parsed(certificate: x509.Certificate) -> x509.Certificate:
    """The certificate, once every field the checks read has parsed (cryptography parses lazily)."""
    _ = (certificate.subject, certificate.issuer, certificate.public_key(), certificate.extensions)
    return certificate
