"""Azure IMDS attested documents, as `/metadata/attested/document` serves them.

On Azure the answer is `{"encoding": "pkcs7", "signature": <base64 DER>}`: a CMS SignedData whose
embedded content is a small JSON document (vmId, subscriptionId, nonce, timeStamp, ...), signed
without signed attributes by a certificate named metadata.azure.com. Only that signer certificate is
embedded; its issuer, a Microsoft intermediate CA, is found through the certificate's Authority
Information Access (caIssuers URL), and chains to a public root.

The simulator cannot sign as Microsoft, so `AttestationAuthority.generate()` makes a PKI of its own
per run (root CA -> intermediate CA -> signer), with the signer certificate shaped like Azure's: the
subject and SubjectAltName metadata.azure.com and <region>.metadata.azure.com, key usage
digitalSignature/keyEncipherment/dataEncipherment, extended key usage serverAuth and clientAuth,
and a caIssuers URL on www.microsoft.com. A verifier that trusts `roots_pem()` instead of Azure's
roots checks a simulated document exactly as it checks a real one.

Shape of the signed content, from the IMDS documentation ("Attested data") and real documents:
compact JSON with sorted keys, timestamps as "MM/DD/YY HH:MM:SS -0000" in UTC, and, without a
`nonce` in the request, the current UTC time as "YYYYMMDD-HHMMSS" in its place. Real documents are
valid for six hours (`expiresOn` = `createdOn` + 6 h): `ATTESTED_TTL`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID, NameOID

SIGNER_NAME = "metadata.azure.com"  # the public cloud's signer (sovereign clouds have others)
ATTESTED_TTL = timedelta(hours=6)  # createdOn -> expiresOn of the documents Azure serves
TIMESTAMP_FORMAT = "%m/%d/%y %H:%M:%S -0000"  # "11/30/20 21:19:19 -0000", always UTC
DEFAULT_NONCE_FORMAT = "%Y%m%d-%H%M%S"  # the nonce IMDS puts in when the request has none
KEY_SIZE = 2048
CA_LIFETIME = timedelta(days=14)
SIGNER_LIFETIME = timedelta(days=7)
BACKDATE = timedelta(days=1)  # certificates start a day early, so a skewed verifier clock still fits
# Where the signer's caIssuers URL points: the host Microsoft serves its intermediates from, with a
# file name of this run's own (nothing is served there; `serve_issuer` answers for it in tests).
ISSUER_URL_BASE = "http://www.microsoft.com/pkiops/certs/"

_ORGANIZATION = "Maintenance Bridge Simulator"


class AttestationAuthority:
    """Signs attested documents with a PKI made for this run; `roots_pem()` is what to trust."""

    def __init__(
        self,
        root: x509.Certificate,
        intermediate: x509.Certificate,
        signer: x509.Certificate,
        signer_key: rsa.RSAPrivateKey,
    ) -> None:
        if signer.public_key() != signer_key.public_key():
            raise ValueError("the signer key does not belong to the signer certificate")
        signer.verify_directly_issued_by(intermediate)
        intermediate.verify_directly_issued_by(root)
        self._root = root
        self._intermediate = intermediate
        self._signer = signer
        self._signer_key = signer_key

    @classmethod
    def generate(
        cls,
        now: datetime | None = None,
        *,
        region: str = "westeurope",
        issuer_url_base: str = ISSUER_URL_BASE,
        intermediate_name: x509.Name | None = None,
        extra_issuer_urls: Sequence[str] = (),
    ) -> AttestationAuthority:
        """A new root CA, intermediate CA and metadata.azure.com signer (RSA 2048, SHA-256).

        The CAs are valid from a day before `now` for 14 days, the signer for 7 days: a few days
        around `now`, longer than any simulator run. The signer's caIssuers URL is a file of this
        run's own under `issuer_url_base`, followed by `extra_issuer_urls`. `intermediate_name`
        names the intermediate CA otherwise than the simulator's: with one of Microsoft's names
        it makes what a forger can make, a signer claiming an Azure issuing CA.
        """
        moment = _utc(now) if now is not None else datetime.now(timezone.utc)
        root_key = _new_key()
        root_name = _name(f"{_ORGANIZATION} Root G2")
        root = (
            _builder(root_name, root_name, root_key, moment, CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_ca_key_usage(), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(root_key.public_key()), critical=False)
            .sign(root_key, hashes.SHA256())
        )
        intermediate_key = _new_key()
        if intermediate_name is None:
            intermediate_name = _name(f"{_ORGANIZATION} TLS Issuing CA 01")
        intermediate = (
            _builder(intermediate_name, root_name, intermediate_key, moment, CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_ca_key_usage(), critical=True)
            .add_extension(_tls_usages(), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(intermediate_key.public_key()), critical=False)
            .add_extension(_authority_key_id(root), critical=False)
            .sign(root_key, hashes.SHA256())
        )
        signer_key = _new_key()
        issuer_url = issuer_url_base + f"mbridge-sim-issuing-ca-{_short_id(intermediate)}.crt"
        signer_name = x509.Name(
            [
                x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORGANIZATION),
                x509.NameAttribute(NameOID.COMMON_NAME, SIGNER_NAME),
            ]
        )
        san = [x509.DNSName(SIGNER_NAME), x509.DNSName(f"{region}.{SIGNER_NAME}")]
        issuers = [
            x509.AccessDescription(AuthorityInformationAccessOID.CA_ISSUERS, x509.UniformResourceIdentifier(url))
            for url in (issuer_url, *extra_issuer_urls)
        ]
        signer = (
            _builder(signer_name, intermediate_name, signer_key, moment, SIGNER_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=True,
                    data_encipherment=True,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(_tls_usages(), critical=False)
            .add_extension(x509.SubjectAlternativeName(san), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(signer_key.public_key()), critical=False)
            .add_extension(_authority_key_id(intermediate), critical=False)
            .add_extension(x509.AuthorityInformationAccess(issuers), critical=False)
            .sign(intermediate_key, hashes.SHA256())
        )
        return cls(root, intermediate, signer, signer_key)

    @property
    def root(self) -> x509.Certificate:
        return self._root

    @property
    def intermediate(self) -> x509.Certificate:
        return self._intermediate

    @property
    def signer(self) -> x509.Certificate:
        """The certificate the documents embed (the only one they embed, as on Azure)."""
        return self._signer

    @property
    def signer_key(self) -> rsa.RSAPrivateKey:
        """The signer's private key (a test PKI's: for tests that build other CMS shapes with it)."""
        return self._signer_key

    @property
    def issuer_url(self) -> str:
        """The signer certificate's caIssuers URL (where a verifier would fetch the intermediate)."""
        access = self._signer.extensions.get_extension_for_class(x509.AuthorityInformationAccess).value
        urls = [d.access_location.value for d in access if d.access_method == AuthorityInformationAccessOID.CA_ISSUERS]
        return str(urls[0])

    def roots_pem(self) -> bytes:
        """The root CA in PEM: what a verifier of this simulator's documents trusts."""
        return self._root.public_bytes(serialization.Encoding.PEM)

    def intermediates_pem(self) -> bytes:
        """The intermediate CA in PEM (what a verifier may hold instead of fetching it)."""
        return self._intermediate.public_bytes(serialization.Encoding.PEM)

    def serve_issuer(self, url: str) -> bytes | None:
        """What the caIssuers URL would answer: the intermediate in DER for `issuer_url`, else None."""
        if url == self.issuer_url:
            return self._intermediate.public_bytes(serialization.Encoding.DER)
        return None

    def sign(
        self,
        vm_id: str,
        subscription_id: str,
        nonce: str | None,
        now: datetime,
        ttl: timedelta = ATTESTED_TTL,
        *,
        signed_attributes: bool = False,
    ) -> dict[str, str]:
        """The IMDS answer for one VM: `{"encoding": "pkcs7", "signature": <base64 DER SignedData>}`.

        `now` is createdOn (whole seconds), `now + ttl` expiresOn; a `nonce` of None becomes `now`
        as YYYYMMDD-HHMMSS, as IMDS puts the current time in. Azure signs the content itself, without signed attributes;
        `signed_attributes=True` signs a contentType/signingTime/messageDigest set instead (the other
        form CMS allows, for verifiers that must accept both).
        """
        return self.sign_content(
            attested_content(vm_id, subscription_id, nonce, now, ttl), signed_attributes=signed_attributes
        )

    def sign_content(self, content: bytes, *, signed_attributes: bool = False) -> dict[str, str]:
        """An IMDS-shaped answer for any content (to test how a verifier reads odd documents)."""
        options = [pkcs7.PKCS7Options.Binary]
        options.append(pkcs7.PKCS7Options.NoCapabilities if signed_attributes else pkcs7.PKCS7Options.NoAttributes)
        der = (
            pkcs7.PKCS7SignatureBuilder()
            .set_data(content)
            .add_signer(self._signer, self._signer_key, hashes.SHA256())
            .sign(serialization.Encoding.DER, options)
        )
        return {"encoding": "pkcs7", "signature": base64.b64encode(der).decode("ascii")}


def attested_content(
    vm_id: str, subscription_id: str, nonce: str | None, now: datetime, ttl: timedelta = ATTESTED_TTL
) -> bytes:
    """The signed JSON: the documented fields, keys sorted, no spaces (as Azure writes it)."""
    created = _utc(now).replace(microsecond=0)
    document = {
        "licenseType": "",
        "nonce": nonce if nonce is not None else created.strftime(DEFAULT_NONCE_FORMAT),
        "plan": {"name": "", "product": "", "publisher": ""},
        "sku": "",
        "subscriptionId": subscription_id,
        "timeStamp": {
            "createdOn": created.strftime(TIMESTAMP_FORMAT),
            "expiresOn": (created + ttl).strftime(TIMESTAMP_FORMAT),
        },
        "vmId": vm_id,
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=KEY_SIZE)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, key: rsa.RSAPrivateKey, now: datetime, lifetime: timedelta
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + lifetime)
    )


def _ca_key_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )


def _tls_usages() -> x509.ExtendedKeyUsage:
    return x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])


def _authority_key_id(issuer: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    ski = issuer.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _short_id(certificate: x509.Certificate) -> str:
    return hashlib.sha256(certificate.public_bytes(serialization.Encoding.DER)).hexdigest()[:16]


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError(f"times must be timezone-aware (UTC), got naive {moment.isoformat()}")
    return moment.astimezone(timezone.utc)
