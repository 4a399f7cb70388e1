"""Steps 3 and 4: the signature over the signed bytes (cryptography verifies it with the embedded
signer certificate's key), and the signer certificate's name.
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from functions.trust.azure_attested.certificates import CERT_ERRORS
from functions.trust.azure_attested.errors import AttestationError
from functions.trust.azure_attested.signed_data import ECDSA_WITH, RSA_ENCRYPTION, RSA_WITH, SignedData


def check_signature(signed: SignedData) -> None:
    key = signed.signer.public_key()
    oid = signed.signature_oid
    algorithm = signed.hash_algorithm
    named = RSA_WITH.get(oid) or ECDSA_WITH.get(oid)
    if named is not None and not isinstance(algorithm, named):
        raise AttestationError(f"the signature algorithm {oid} does not use the digest algorithm {algorithm.name}")
    try:
        if oid == RSA_ENCRYPTION or oid in RSA_WITH:
            if not isinstance(key, rsa.RSAPublicKey):
                raise AttestationError(f"the signature algorithm {oid} is RSA, the signer's key is not")
            key.verify(signed.signature, signed.signed_bytes, padding.PKCS1v15(), algorithm)
        elif oid in ECDSA_WITH:
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


def signer_name(signer: x509.Certificate, signer_names: Sequence[str]) -> str:
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
    except CERT_ERRORS as exc:
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
