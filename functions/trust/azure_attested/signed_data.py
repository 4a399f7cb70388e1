"""Steps 1 and 2: the base64 signature, and the DER CMS SignedData (RFC 5652) it holds, read with
asn1crypto into what the later steps check: the content, the signer and other certificates, the
digest and signature algorithms, and the bytes the signature covers.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass
from typing import Any

from asn1crypto import cms, core  # type: ignore[import-untyped]
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from functions.trust.azure_attested.certificates import load_certificate
from functions.trust.azure_attested.errors import AttestationError

MAX_DOCUMENT_BYTES = 64 * 1024  # a real document is about 2 KiB
MAX_EMBEDDED_CERTIFICATES = 4  # IMDS embeds one, the signer's; each is checked against the others
_MAX_SIGNATURE_CHARS = 4 * ((MAX_DOCUMENT_BYTES + 2) // 3)  # its base64

_SHA2: dict[str, type[hashes.HashAlgorithm]] = {
    "2.16.840.1.101.3.4.2.1": hashes.SHA256,
    "2.16.840.1.101.3.4.2.2": hashes.SHA384,
    "2.16.840.1.101.3.4.2.3": hashes.SHA512,
}
# sha*WithRSAEncryption: Azure names these where CMS wants the digest algorithm, too.
RSA_WITH: dict[str, type[hashes.HashAlgorithm]] = {
    "1.2.840.113549.1.1.11": hashes.SHA256,
    "1.2.840.113549.1.1.12": hashes.SHA384,
    "1.2.840.113549.1.1.13": hashes.SHA512,
}
ECDSA_WITH: dict[str, type[hashes.HashAlgorithm]] = {
    "1.2.840.10045.4.3.2": hashes.SHA256,
    "1.2.840.10045.4.3.3": hashes.SHA384,
    "1.2.840.10045.4.3.4": hashes.SHA512,
}
RSA_ENCRYPTION = "1.2.840.113549.1.1.1"
# What asn1crypto raises for malformed input (it parses lazily, so also while fields are read).
_PARSE_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError)


@dataclass(frozen=True)
class SignedData:
    content: bytes
    signer: x509.Certificate
    others: list[x509.Certificate]  # the other embedded certificates (untrusted intermediates)
    hash_algorithm: hashes.HashAlgorithm
    signature_oid: str
    signed_bytes: bytes  # what the signature covers
    signature: bytes


def decode(signature_b64: str) -> bytes:
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


def parse(raw: bytes) -> SignedData:
    try:
        return _read_signed_data(raw)
    except AttestationError:
        raise
    except _PARSE_ERRORS as exc:
        raise AttestationError(
            f"the signature is not a well-formed DER CMS SignedData ({exc}); it is damaged or not an attested document"
        ) from exc


def _read_signed_data(raw: bytes) -> SignedData:
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
    if len(choices) > MAX_EMBEDDED_CERTIFICATES:
        raise AttestationError(
            f"the signed data embeds {len(choices)} certificates, more than {MAX_EMBEDDED_CERTIFICATES}; "
            "IMDS embeds one, the signer's"
        )
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
    hash_type = _SHA2.get(digest["algorithm"].dotted) or RSA_WITH.get(digest["algorithm"].dotted)
    if hash_type is None:
        raise AttestationError(f"the digest algorithm {digest['algorithm'].dotted} is not SHA-256, SHA-384 or SHA-512")
    _no_parameters(digest, "digest algorithm")
    if not any(listed.dump() == digest.dump() for listed in signed["digest_algorithms"]):
        raise AttestationError("the signer's digest algorithm is missing from the SignedData's digestAlgorithms")
    signature_algorithm = info_["signature_algorithm"]
    _no_parameters(signature_algorithm, "signature algorithm")
    hash_algorithm = hash_type()
    signed_bytes = _signed_bytes(info_["signed_attrs"], content, hash_algorithm)

    certificates = [load_certificate(cert.dump()) for cert in embedded]
    index = matches[0]
    return SignedData(
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
