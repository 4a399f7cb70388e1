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
5. the chain from the signer to one of `roots`, valid at `valid_at`, with `intermediates`, the
   other embedded certificates and, when none of them issued the signer and `fetch_issuer` is
   given, the certificate at the signer's caIssuers URL (only http(s) on `ISSUER_HOSTS`, cached
   per URL in a small module cache);
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
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable
from urllib.parse import urlsplit

from asn1crypto import cms, core  # type: ignore[import-untyped]
from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509 import verification
from cryptography.x509.oid import AuthorityInformationAccessOID

MAX_DOCUMENT_BYTES = 64 * 1024  # a real document is about 2 KiB
_MAX_SIGNATURE_CHARS = 4 * ((MAX_DOCUMENT_BYTES + 2) // 3)  # its base64
CLOCK_SKEW = timedelta(minutes=5)  # how far a VM's clock may run ahead of the verifier's
DEFAULT_SIGNER_NAMES = ("metadata.azure.com",)  # public cloud; .us, .cn, microsoftazure.de elsewhere
# Hosts a signer's caIssuers URL may be fetched from: Microsoft's PKI repository (pki/mscorp and
# pkiops/certs on www.microsoft.com) and DigiCert's, where the cross-signed roots are published.
ISSUER_HOSTS = frozenset({"www.microsoft.com", "cacerts.digicert.com"})
ISSUER_CACHE_SIZE = 16
TIMESTAMP_FORMAT = "%m/%d/%y %H:%M:%S %z"  # "11/30/20 21:19:19 -0000"

_SHA2: dict[str, type[hashes.HashAlgorithm]] = {
    "2.16.840.1.101.3.4.2.1": hashes.SHA256,
    "2.16.840.1.101.3.4.2.2": hashes.SHA384,
    "2.16.840.1.101.3.4.2.3": hashes.SHA512,
}
# sha*WithRSAEncryption: Azure names these where CMS wants the digest algorithm, too.
_RSA_WITH: dict[str, type[hashes.HashAlgorithm]] = {
    "1.2.840.113549.1.1.11": hashes.SHA256,
    "1.2.840.113549.1.1.12": hashes.SHA384,
    "1.2.840.113549.1.1.13": hashes.SHA512,
}
_ECDSA_WITH: dict[str, type[hashes.HashAlgorithm]] = {
    "1.2.840.10045.4.3.2": hashes.SHA256,
    "1.2.840.10045.4.3.3": hashes.SHA384,
    "1.2.840.10045.4.3.4": hashes.SHA512,
}
_RSA_ENCRYPTION = "1.2.840.113549.1.1.1"
# What asn1crypto raises for malformed input (it parses lazily, so also while fields are read).
_PARSE_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError)
_CERT_ERRORS = (
    ValueError,
    TypeError,
    UnsupportedAlgorithm,
    x509.InvalidVersion,
    x509.DuplicateExtension,
    x509.UnsupportedGeneralNameType,
)


class AttestationError(ValueError):
    """The attested document is not valid proof; the message says what failed and what to check."""


class IssuerFetchError(AttestationError):
    """The signer's issuing CA could not be fetched from its caIssuers URL (a retry may succeed)."""


@dataclass(frozen=True)
class AttestedDocument:
    """What a verified document says, and who signed it."""

    vm_id: str
    subscription_id: str
    nonce: str
    created_on: datetime  # UTC
    expires_on: datetime  # UTC
    signer: str  # the signer certificate's DNS name that matched `signer_names`
    content: dict[str, Any]  # the whole signed JSON


@dataclass(frozen=True)
class _SignedData:
    content: bytes
    signer: x509.Certificate
    others: list[x509.Certificate]  # the other embedded certificates (untrusted intermediates)
    hash_algorithm: hashes.HashAlgorithm
    signature_oid: str
    signed_bytes: bytes  # what the signature covers
    signature: bytes


def verify_attested_document(
    signature_b64: str,
    *,
    roots: Sequence[x509.Certificate],
    intermediates: Sequence[x509.Certificate] = (),
    signer_names: Sequence[str] = DEFAULT_SIGNER_NAMES,
    valid_at: datetime,
    fetch_issuer: Callable[[str], bytes] | None = None,
) -> AttestedDocument:
    """Check an IMDS attested document's `signature` and return what it attests.

    Args:
        signature_b64: the `signature` field of the IMDS answer (base64 of DER PKCS#7).
        roots: the trusted roots (for Azure: DigiCert Global Root G2, Microsoft TLS RSA Root G2).
        intermediates: issuing CAs known beforehand (saves fetching them).
        signer_names: names the signer certificate must carry (or a subdomain of one).
        valid_at: the moment the document must be valid at (timezone-aware), e.g. when the
            message carrying it was accepted.
        fetch_issuer: url -> the certificate there (DER or PEM); called for the signer's
            caIssuers URL when no known intermediate issued the signer, on allowed hosts only.

    Raises:
        AttestationError: the document is not valid proof at `valid_at` (IssuerFetchError when
            the issuing CA could not be fetched: the same document may verify later).
    """
    if valid_at.tzinfo is None:
        raise AttestationError(f"valid_at must be timezone-aware, got naive {valid_at.isoformat()}")
    moment = valid_at.astimezone(timezone.utc)
    if not roots:
        raise AttestationError("no trusted roots were given; configure the Azure roots (DigiCert Global Root G2)")
    raw = _decode(signature_b64)
    signed = _parse(raw)
    _check_signature(signed)
    name = _signer_name(signed.signer, signer_names)
    _check_chain(signed, name, roots, intermediates, moment, fetch_issuer)
    return _read_content(signed.content, name, moment)


def load_certificates(pem_or_der: bytes) -> list[x509.Certificate]:
    """Certificates from a PEM bundle (one or more) or from one DER certificate."""
    if not isinstance(pem_or_der, (bytes, bytearray)):
        raise AttestationError(f"certificates must be bytes (PEM or DER), got {type(pem_or_der).__name__}")
    data = bytes(pem_or_der)
    try:
        if b"-----BEGIN" in data:
            return [_parsed(cert) for cert in x509.load_pem_x509_certificates(data)]
        return [_parsed(x509.load_der_x509_certificate(data))]
    except _CERT_ERRORS as exc:
        raise AttestationError(
            f"not a PEM bundle of certificates nor one DER certificate ({exc}); check the file or URL"
        ) from exc


def clear_issuer_cache() -> None:
    """Forget the issuing CAs fetched so far (they are fetched again when needed)."""
    with _cache_lock:
        _issuer_cache.clear()


# ---- 1. base64


def _decode(signature_b64: str) -> bytes:
    if not isinstance(signature_b64, str):
        raise AttestationError(f"the signature must be a base64 string, got {type(signature_b64).__name__}")
    text = signature_b64.strip()
    if len(text) > _MAX_SIGNATURE_CHARS:
        raise AttestationError(
            f"the signature is {len(text)} characters, more than a document of {MAX_DOCUMENT_BYTES} bytes can be; "
            "an IMDS attested document is about 3,000"
        )
    if not text:
        raise AttestationError("the signature is empty; pass the `signature` field of the IMDS answer")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AttestationError(
            f"the signature is not base64 ({exc}); pass the `signature` field as IMDS sent it"
        ) from exc
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise AttestationError(f"the document is {len(raw)} bytes, more than {MAX_DOCUMENT_BYTES}")
    return raw


# ---- 2. CMS structure


def _parse(raw: bytes) -> _SignedData:
    try:
        return _read_signed_data(raw)
    except AttestationError:
        raise
    except _PARSE_ERRORS as exc:
        raise AttestationError(
            f"the signature is not a well-formed DER CMS SignedData ({exc}); it is damaged or not an attested document"
        ) from exc


def _read_signed_data(raw: bytes) -> _SignedData:
    info = cms.ContentInfo.load(raw, strict=True)
    if info["content_type"].dotted != "1.2.840.113549.1.7.2":
        raise AttestationError(f"the PKCS#7 content is {info['content_type'].native!r}, not signed data")
    signed = info["content"]
    encap = signed["encap_content_info"]
    if encap["content_type"].native != "data":
        raise AttestationError(f"the signed content type is {encap['content_type'].native!r}, not data")
    content = encap["content"].native if not isinstance(encap["content"], core.Void) else None
    if not isinstance(content, bytes):
        raise AttestationError("the signed data embeds no content (a detached signature); IMDS embeds the document")

    choices = signed["certificates"]
    if isinstance(choices, core.Void) or len(choices) == 0:
        raise AttestationError("the signed data embeds no certificate; IMDS embeds the signer's")
    embedded = []
    for choice in choices:
        if choice.name != "certificate":
            raise AttestationError(f"the signed data embeds a {choice.name}, not only X.509 certificates")
        # A signature is whole octets: a BIT STRING with unused bits is another encoding of the same
        # certificate, which the chain check would accept (its padding bits are not signed).
        if choice.chosen["signature_value"].contents[:1] != b"\x00":
            raise AttestationError("an embedded certificate's signature has unused bits; it is not DER")
        embedded.append(choice.chosen)

    infos = signed["signer_infos"]
    if len(infos) != 1:
        raise AttestationError(f"the signed data has {len(infos)} signers, not exactly one")
    info_ = infos[0]
    sid = info_["sid"]
    by_key_id = sid.name == "subject_key_identifier"
    if info_["version"].native != ("v3" if by_key_id else "v1"):
        raise AttestationError(f"the SignerInfo version {info_['version'].native} does not fit its {sid.name}")
    if signed["version"].native != ("v3" if by_key_id else "v1"):
        raise AttestationError(f"the SignedData version {signed['version'].native} is not what RFC 5652 gives it")
    matches = [index for index, cert in enumerate(embedded) if _identifies(sid, cert)]
    if len(matches) != 1:
        raise AttestationError(
            f"the signer is {'not among' if not matches else 'ambiguous among'} the embedded certificates "
            f"({len(embedded)} embedded); the document must carry its signer's certificate"
        )

    digest = info_["digest_algorithm"]
    hash_type = _SHA2.get(digest["algorithm"].dotted) or _RSA_WITH.get(digest["algorithm"].dotted)
    if hash_type is None:
        raise AttestationError(f"the digest algorithm {digest['algorithm'].dotted} is not SHA-256, SHA-384 or SHA-512")
    _no_parameters(digest, "digest algorithm")
    if not any(listed.dump() == digest.dump() for listed in signed["digest_algorithms"]):
        raise AttestationError("the signer's digest algorithm is missing from the SignedData's digestAlgorithms")
    signature_algorithm = info_["signature_algorithm"]
    _no_parameters(signature_algorithm, "signature algorithm")
    hash_algorithm = hash_type()
    signed_bytes = _signed_bytes(info_["signed_attrs"], content, hash_algorithm)

    certificates = [_load_certificate(cert.dump()) for cert in embedded]
    index = matches[0]
    return _SignedData(
        content=content,
        signer=certificates[index],
        others=certificates[:index] + certificates[index + 1 :],
        hash_algorithm=hash_algorithm,
        signature_oid=signature_algorithm["algorithm"].dotted,
        signed_bytes=signed_bytes,
        signature=bytes(info_["signature"].native),
    )


def _identifies(sid: Any, cert: Any) -> bool:
    if sid.name == "issuer_and_serial_number":
        wanted = sid.chosen
        return bool(
            wanted["issuer"].dump() == cert.issuer.dump() and wanted["serial_number"].native == cert.serial_number
        )
    if sid.name == "subject_key_identifier":
        return bool(cert.key_identifier is not None and cert.key_identifier == sid.chosen.native)
    return False


def _no_parameters(algorithm: Any, what: str) -> None:
    parameters = algorithm["parameters"]
    if not isinstance(parameters, (core.Void, core.Null)) and parameters.native is not None:
        raise AttestationError(f"the {what} {algorithm['algorithm'].dotted} has parameters it should not have")


def _signed_bytes(attributes: Any, content: bytes, hash_algorithm: hashes.HashAlgorithm) -> bytes:
    """What the signature covers: the content, or the signed attributes' DER as a SET OF."""
    if isinstance(attributes, core.Void):
        return content
    seen: dict[str, Any] = {}
    for attribute in attributes:
        kind = attribute["type"].dotted
        if kind in seen:
            raise AttestationError(f"the signed attribute {attribute['type'].native} appears twice")
        seen[kind] = attribute["values"]
    content_types = seen.get("1.2.840.113549.1.9.3")
    digests = seen.get("1.2.840.113549.1.9.4")
    if content_types is None or len(content_types) != 1 or content_types[0].native != "data":
        raise AttestationError("the signed attributes lack a contentType of data (RFC 5652 requires one)")
    if digests is None or len(digests) != 1:
        raise AttestationError("the signed attributes lack a single messageDigest (RFC 5652 requires one)")
    hasher = hashes.Hash(hash_algorithm)
    hasher.update(content)
    if not hmac.compare_digest(hasher.finalize(), bytes(digests[0].native)):
        raise AttestationError("the messageDigest attribute does not match the content: the content was changed")
    encoded = bytes(attributes.dump())
    # Signed as the universal SET OF (0x31), sent with the implicit [0] tag (0xA0): RFC 5652, 5.4.
    return b"\x31" + encoded[1:]


def _load_certificate(der: bytes) -> x509.Certificate:
    try:
        return _parsed(x509.load_der_x509_certificate(der))
    except _CERT_ERRORS as exc:
        raise AttestationError(f"an embedded certificate does not parse ({exc})") from exc


def _parsed(certificate: x509.Certificate) -> x509.Certificate:
    """The certificate, once every field the checks read has parsed (cryptography parses lazily)."""
    _ = (certificate.subject, certificate.issuer, certificate.public_key(), certificate.extensions)
    return certificate


# ---- 3. signature


def _check_signature(signed: _SignedData) -> None:
    key = signed.signer.public_key()
    oid = signed.signature_oid
    algorithm = signed.hash_algorithm
    named = _RSA_WITH.get(oid) or _ECDSA_WITH.get(oid)
    if named is not None and not isinstance(algorithm, named):
        raise AttestationError(f"the signature algorithm {oid} does not use the digest algorithm {algorithm.name}")
    try:
        if oid == _RSA_ENCRYPTION or oid in _RSA_WITH:
            if not isinstance(key, rsa.RSAPublicKey):
                raise AttestationError(f"the signature algorithm {oid} is RSA, the signer's key is not")
            key.verify(signed.signature, signed.signed_bytes, padding.PKCS1v15(), algorithm)
        elif oid in _ECDSA_WITH:
            if not isinstance(key, ec.EllipticCurvePublicKey):
                raise AttestationError(f"the signature algorithm {oid} is ECDSA, the signer's key is not")
            key.verify(signed.signature, signed.signed_bytes, ec.ECDSA(algorithm))
        else:
            raise AttestationError(f"the signature algorithm {oid} is not supported (RSA PKCS#1 v1.5 or ECDSA)")
    except InvalidSignature as exc:
        raise AttestationError(
            "the signature does not verify with the embedded signer certificate: the document was changed "
            "or signed by another key"
        ) from exc
    except (UnsupportedAlgorithm, ValueError) as exc:
        raise AttestationError(f"the signature cannot be checked ({exc})") from exc


# ---- 4. signer name


def _signer_name(signer: x509.Certificate, signer_names: Sequence[str]) -> str:
    if isinstance(signer_names, str):
        signer_names = (signer_names,)
    allowed = [name.lower().rstrip(".") for name in signer_names if name]
    if not allowed:
        raise AttestationError("no signer names were given; the public cloud's is metadata.azure.com")
    try:
        san = signer.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = san.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound as exc:
        raise AttestationError(
            "the signer certificate has no SubjectAltName; Azure's names metadata.azure.com"
        ) from exc
    except _CERT_ERRORS as exc:
        raise AttestationError(f"the signer certificate's extensions do not parse ({exc})") from exc
    exact = [name for name in names if name.lower() in allowed]
    below = [
        name
        for name in names
        if not name.startswith("*") and any(name.lower().endswith("." + base) for base in allowed)
    ]
    if exact or below:
        return (exact or below)[0]
    raise AttestationError(
        f"the signer certificate is for {names or 'no DNS name'}, none of which is {list(signer_names)} or a "
        "subdomain of one; check signer_names for this cloud (metadata.azure.us, metadata.azure.cn, ...)"
    )


# ---- 5. chain


def _check_chain(
    signed: _SignedData,
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
    except _CERT_ERRORS as exc:
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
        certificates = _cached(url)
        if certificates is None or not any(_issued(signer, c) for c in certificates):
            certificates = _fetch(url, fetch_issuer)
            _remember(url, certificates)
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


_issuer_cache: OrderedDict[str, tuple[x509.Certificate, ...]] = OrderedDict()
_cache_lock = threading.Lock()


def _cached(url: str) -> list[x509.Certificate] | None:
    with _cache_lock:
        certificates = _issuer_cache.get(url)
        if certificates is None:
            return None
        _issuer_cache.move_to_end(url)
        return list(certificates)


def _remember(url: str, certificates: list[x509.Certificate]) -> None:
    with _cache_lock:
        _issuer_cache[url] = tuple(certificates)
        _issuer_cache.move_to_end(url)
        while len(_issuer_cache) > ISSUER_CACHE_SIZE:
            _issuer_cache.popitem(last=False)


# ---- 6. content


def _read_content(content: bytes, signer: str, valid_at: datetime) -> AttestedDocument:
    try:
        document = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AttestationError(f"the signed content is not JSON ({exc})") from exc
    if not isinstance(document, dict):
        raise AttestationError("the signed content is not a JSON object")
    vm_id = document.get("vmId")
    subscription_id = document.get("subscriptionId")
    nonce = document.get("nonce")
    if not isinstance(vm_id, str) or not vm_id:
        raise AttestationError("the signed content has no vmId")
    if not isinstance(subscription_id, str) or not subscription_id:
        raise AttestationError(
            "the signed content has no subscriptionId; request the document with api-version 2019-04-30 or later"
        )
    if not isinstance(nonce, str):
        raise AttestationError("the signed content has no nonce")
    stamp = document.get("timeStamp")
    if not isinstance(stamp, dict):
        raise AttestationError("the signed content has no timeStamp")
    created_on = _timestamp(stamp, "createdOn")
    expires_on = _timestamp(stamp, "expiresOn")
    if expires_on < created_on:
        raise AttestationError(f"the document expires ({expires_on}) before it was created ({created_on})")
    if valid_at < created_on - CLOCK_SKEW:
        raise AttestationError(
            f"the document was created at {created_on.isoformat()}, after {valid_at.isoformat()} "
            f"(more than {CLOCK_SKEW} of clock skew): check the clocks"
        )
    if valid_at > expires_on:
        raise AttestationError(
            f"the document expired at {expires_on.isoformat()}, before {valid_at.isoformat()}: fetch a new one"
        )
    return AttestedDocument(
        vm_id=vm_id,
        subscription_id=subscription_id,
        nonce=nonce,
        created_on=created_on,
        expires_on=expires_on,
        signer=signer,
        content=document,
    )


def _timestamp(stamp: dict[str, Any], key: str) -> datetime:
    value = stamp.get(key)
    if not isinstance(value, str):
        raise AttestationError(f"the signed content has no timeStamp.{key}")
    try:
        return datetime.strptime(value, TIMESTAMP_FORMAT).astimezone(timezone.utc)
    except ValueError as exc:
        raise AttestationError(
            f"timeStamp.{key} {value!r} is not in IMDS's format MM/DD/YY HH:MM:SS -0000 ({exc})"
        ) from exc
