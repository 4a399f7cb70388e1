"""The shipped Azure issuing CAs and root (functions/trust/azure_attested/azure_cas) are what their
README says they are: CAs of Microsoft's names, signed by a public root (certifi's bundle), by the
shipped root or by another shipped CA, with the SHA-256 fingerprints the README records.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from pathlib import Path

import certifi
import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import NameOID

from functions.trust.azure_attested.issuing_cas import azure_extra_roots, azure_issuer_names, azure_issuing_cas

README = Path(__file__).parents[3] / "functions" / "trust" / "azure_attested" / "azure_cas" / "README.md"
MICROSOFT = x509.Name(
    [
        x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Microsoft Corporation"),
    ]
)
# The names Microsoft documents for the issuing CAs of Azure's TLS and attested-data signers.
DOCUMENTED = re.compile(
    r"Microsoft Azure (RSA |ECC )?TLS Issuing CA (0[1-8])|Microsoft TLS G2 RSA CA OCSP (0[2468]|1[0246])"
    r"|Microsoft TLS RSA Root G2"
)


def public_roots() -> list[x509.Certificate]:
    data = Path(certifi.where()).read_bytes()
    blocks = re.findall(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", data, flags=re.S)
    roots = []
    with warnings.catch_warnings():
        # certifi holds a root or two that break RFC 5280 (a zero serial number); none is Azure's
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        for block in blocks:
            try:
                roots.append(x509.load_pem_x509_certificate(block))
            except ValueError:
                continue
    return roots


def issued(certificate: x509.Certificate, issuer: x509.Certificate) -> bool:
    if certificate.issuer != issuer.subject:
        return False
    try:
        certificate.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def fingerprint(certificate: x509.Certificate) -> str:
    return hashlib.sha256(certificate.public_bytes(serialization.Encoding.DER)).hexdigest()


def common_name(certificate: x509.Certificate) -> str:
    return str(certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


SHIPPED = [*azure_issuing_cas(), *azure_extra_roots()]


@pytest.mark.parametrize("certificate", SHIPPED, ids=common_name)
def test_each_shipped_certificate_is_a_microsoft_ca(certificate: x509.Certificate) -> None:
    constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    usage = certificate.extensions.get_extension_for_class(x509.KeyUsage).value
    assert constraints.ca
    assert usage.key_cert_sign
    assert DOCUMENTED.fullmatch(common_name(certificate))
    assert certificate.subject == x509.Name(
        [*MICROSOFT, *certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    )
    assert certificate.not_valid_before_utc < certificate.not_valid_after_utc


@pytest.mark.parametrize("certificate", azure_issuing_cas(), ids=common_name)
def test_each_issuing_ca_chains_to_a_public_or_shipped_root(certificate: x509.Certificate) -> None:
    signers = [*public_roots(), *azure_extra_roots(), *azure_issuing_cas()]
    issuers = [candidate for candidate in signers if candidate is not certificate and issued(certificate, candidate)]
    assert issuers, f"nothing shipped or in certifi signed {certificate.subject.rfc4514_string()}"


def test_the_shipped_root_signs_itself_with_the_key_digicert_certified() -> None:
    (root,) = azure_extra_roots()
    assert issued(root, root)
    cross_signed = [ca for ca in azure_issuing_cas() if ca.subject == root.subject]
    assert [common_name(ca) for ca in cross_signed] == ["Microsoft TLS RSA Root G2"]
    assert cross_signed[0].public_key() == root.public_key()
    assert any(issued(cross_signed[0], public) for public in public_roots())


def test_the_readme_records_each_shipped_certificate() -> None:
    recorded = re.findall(r"\| `([0-9a-f]{64})` \| (\S+/\S+) (\S+) @ ([0-9a-f]{40}) \|", README.read_text("utf-8"))
    assert sorted(fingerprint(certificate) for certificate in SHIPPED) == sorted(row[0] for row in recorded)


def test_every_shipped_issuing_ca_may_be_recognised_by_name() -> None:
    assert {ca.subject for ca in azure_issuing_cas()} <= azure_issuer_names()
    assert len(azure_issuer_names()) == 15 + 6  # 15 distinct names shipped, OCSP 06-16 listed
