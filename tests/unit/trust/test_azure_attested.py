"""The Azure attested document verifier against documents of the simulator's authority.

The authority (simulator/attestation.py) signs like IMDS: DER CMS SignedData, content
embedded, only the signer certificate embedded, no signed attributes. Every test builds what it
needs from it, or edits its DER with asn1crypto; nothing here talks to the network.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from asn1crypto import cms  # type: ignore[import-untyped]
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.serialization import pkcs7

from functions.trust.azure_attested import (
    CLOCK_SKEW,
    MAX_DOCUMENT_BYTES,
    AttestationError,
    IssuerFetchError,
    clear_issuer_cache,
    load_certificates,
    verify_attested_document,
)
from simulator.attestation import ATTESTED_TTL, AttestationAuthority, attested_content
from simulator.azure_api import SIM_SUBSCRIPTION_ID, vm_id
from tests.fixtures import FIXTURES

NOW = datetime(2026, 1, 15, 12, 0, 0, tzinfo=timezone.utc)
VM_ID = "02aab8a4-74ef-476e-8182-f6d2ba4166a6"
OTHER_VM_ID = "d3e0e374-fda6-4649-bbc9-7f20dc379f34"  # same length: swaps in place
SUBSCRIPTION = "8d10da13-8125-4ba9-a717-bf7490507b3d"
NONCE = "1234567890"
FIXTURE = FIXTURES / "azure" / "attested"


@pytest.fixture(scope="module")
def authority() -> AttestationAuthority:
    return AttestationAuthority.generate(NOW)


@pytest.fixture(scope="module")
def stranger() -> AttestationAuthority:
    """Another PKI with a signer of the same names: what a forger can make."""
    return AttestationAuthority.generate(NOW)


@pytest.fixture(autouse=True)
def _fresh_issuer_cache() -> Iterator[None]:
    clear_issuer_cache()
    yield
    clear_issuer_cache()


class RecordingFetcher:
    """fetch_issuer for tests: serves the authority's intermediate and notes every URL asked for."""

    def __init__(self, authority: AttestationAuthority, answer: bytes | None = None) -> None:
        self.authority = authority
        self.answer = answer
        self.urls: list[str] = []

    def __call__(self, url: str) -> bytes:
        self.urls.append(url)
        if self.answer is not None:
            return self.answer
        served = self.authority.serve_issuer(url)
        if served is None:
            raise OSError(f"404 for {url}")
        return served


def verify(signature: str, authority: AttestationAuthority, **overrides: Any) -> Any:
    """Verify against `authority`'s roots and intermediates at NOW + 1 min unless told otherwise;
    its intermediate is one of the issuers that may be fetched, as Azure's are."""
    options: dict[str, Any] = {
        "roots": load_certificates(authority.roots_pem()),
        "intermediates": load_certificates(authority.intermediates_pem()),
        "valid_at": NOW + timedelta(minutes=1),
        "issuer_names": (authority.intermediate.subject,),
    }
    options.update(overrides)
    return verify_attested_document(signature, **options)


def der_of(document: dict[str, str]) -> bytes:
    return base64.b64decode(document["signature"])


def b64(der: bytes) -> str:
    return base64.b64encode(der).decode("ascii")


# ---- a valid document


def test_a_valid_document_verifies_and_says_which_vm(authority: AttestationAuthority) -> None:
    document = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)
    assert set(document) == {"encoding", "signature"}
    assert document["encoding"] == "pkcs7"

    attested = verify(document["signature"], authority)

    assert attested.vm_id == VM_ID
    assert attested.subscription_id == SUBSCRIPTION
    assert attested.nonce == NONCE
    assert attested.created_on == NOW
    assert attested.expires_on == NOW + ATTESTED_TTL
    assert attested.created_on.tzinfo is not None
    assert attested.signer == "metadata.azure.com"
    assert attested.content == json.loads(attested_content(VM_ID, SUBSCRIPTION, NONCE, NOW))
    assert attested.content["timeStamp"] == {
        "createdOn": "01/15/26 12:00:00 -0000",
        "expiresOn": "01/15/26 18:00:00 -0000",
    }


def test_the_document_has_azures_shape(authority: AttestationAuthority) -> None:
    """Embedded content, only the signer certificate, one signer and no signed attributes."""
    signed = cms.ContentInfo.load(der_of(authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)))["content"]

    assert signed["encap_content_info"]["content"].native == attested_content(VM_ID, SUBSCRIPTION, NONCE, NOW)
    assert [c.chosen.dump() for c in signed["certificates"]] == [
        authority.signer.public_bytes(serialization.Encoding.DER)
    ]
    assert len(signed["signer_infos"]) == 1
    assert signed["signer_infos"][0]["signed_attrs"].native is None


def test_without_a_nonce_the_document_carries_the_time(authority: AttestationAuthority) -> None:
    attested = verify(authority.sign(VM_ID, SUBSCRIPTION, None, NOW)["signature"], authority)
    assert attested.nonce == "20260115-120000"


def test_signed_attributes_are_accepted_too(authority: AttestationAuthority) -> None:
    document = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW, signed_attributes=True)
    assert cms.ContentInfo.load(der_of(document))["content"]["signer_infos"][0]["signed_attrs"].native
    assert verify(document["signature"], authority).vm_id == VM_ID


# ---- tampering


@pytest.mark.parametrize("signed_attributes", [False, True], ids=["content-signed", "attributes-signed"])
def test_changing_any_single_byte_fails(authority: AttestationAuthority, signed_attributes: bool) -> None:
    """Every byte index, each XORed with 0x01 (the smallest change) and with 0xFF (every bit).

    All of them, not a sample: a refused document costs well under a millisecond and a document is
    about 2 KB, so both masks over every index take a second or two.
    """
    der = der_of(authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW, signed_attributes=signed_attributes))
    roots = load_certificates(authority.roots_pem())
    intermediates = load_certificates(authority.intermediates_pem())
    accepted = []
    refused = 0
    for mask in (0x01, 0xFF):
        for index in range(len(der)):
            changed = bytearray(der)
            changed[index] ^= mask
            try:
                verify_attested_document(b64(bytes(changed)), roots=roots, intermediates=intermediates, valid_at=NOW)
            except AttestationError:
                refused += 1
            else:
                accepted.append((hex(mask), index))
    assert accepted == []
    assert refused == 2 * len(der)


@pytest.mark.parametrize("signed_attributes", [False, True], ids=["content-signed", "attributes-signed"])
def test_another_content_under_the_same_signature_fails(
    authority: AttestationAuthority, signed_attributes: bool
) -> None:
    der = der_of(authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW, signed_attributes=signed_attributes))
    assert der.count(VM_ID.encode()) == 1
    swapped = der.replace(VM_ID.encode(), OTHER_VM_ID.encode())

    with pytest.raises(AttestationError, match=r"signature does not verify|messageDigest"):
        verify(b64(swapped), authority)


def test_a_signature_by_another_key_fails(authority: AttestationAuthority) -> None:
    """The genuine signer certificate, with a signature its key did not make."""
    info = cms.ContentInfo.load(der_of(authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)))
    content = info["content"]["encap_content_info"]["content"].native
    forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    info["content"]["signer_infos"][0]["signature"] = forger.sign(content, padding.PKCS1v15(), hashes.SHA256())

    with pytest.raises(AttestationError, match="does not verify with the embedded signer certificate"):
        verify(b64(info.dump(force=True)), authority)


def test_a_signer_from_another_pki_fails(authority: AttestationAuthority, stranger: AttestationAuthority) -> None:
    forged = stranger.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"]

    with pytest.raises(AttestationError, match="does not chain to a trusted root"):
        verify(forged, authority)
    # Handing over the forger's intermediate does not help: the root is what is trusted.
    with pytest.raises(AttestationError, match="does not chain to a trusted root"):
        verify(forged, authority, intermediates=load_certificates(stranger.intermediates_pem()))
    assert verify(forged, stranger).vm_id == VM_ID  # the forgery is otherwise well made


def test_an_embedded_certificate_that_did_not_sign_fails(
    authority: AttestationAuthority, stranger: AttestationAuthority
) -> None:
    """The forger's signature next to the genuine certificate: the signer is not among the certificates."""
    info = cms.ContentInfo.load(der_of(stranger.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)))
    genuine = cms.ContentInfo.load(der_of(authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)))
    info["content"]["certificates"] = genuine["content"]["certificates"]

    with pytest.raises(AttestationError, match="signer is not among the embedded certificates"):
        verify(b64(info.dump(force=True)), authority)


# ---- who signed


def test_a_signer_of_another_name_fails(authority: AttestationAuthority) -> None:
    signature = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"]

    with pytest.raises(AttestationError, match=r"none of which is \['metadata.azure.us'\]"):
        verify(signature, authority, signer_names=("metadata.azure.us",))
    # A name is matched whole, label by label: metadata.azure.com is no subdomain of data.azure.com.
    with pytest.raises(AttestationError, match="none of which"):
        verify(signature, authority, signer_names=("data.azure.com",))


def test_a_regional_name_or_a_parent_domain_is_accepted(authority: AttestationAuthority) -> None:
    signature = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"]

    assert verify(signature, authority, signer_names=("westeurope.metadata.azure.com",)).signer == (
        "westeurope.metadata.azure.com"
    )
    # IMDS's guidance: accept any subdomain of the cloud's name.
    assert verify(signature, authority, signer_names=("azure.com",)).signer == "metadata.azure.com"
    assert verify(signature, authority, signer_names="metadata.azure.com").signer == "metadata.azure.com"


# ---- time


def test_an_expired_document_fails(authority: AttestationAuthority) -> None:
    signature = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"]
    expires = NOW + ATTESTED_TTL

    assert verify(signature, authority, valid_at=expires).vm_id == VM_ID
    with pytest.raises(AttestationError, match="expired at 2026-01-15T18:00:00"):
        verify(signature, authority, valid_at=expires + timedelta(seconds=1))


def test_a_document_from_the_future_fails(authority: AttestationAuthority) -> None:
    signature = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"]

    assert verify(signature, authority, valid_at=NOW - CLOCK_SKEW).vm_id == VM_ID
    with pytest.raises(AttestationError, match="was created at 2026-01-15T12:00:00"):
        verify(signature, authority, valid_at=NOW - CLOCK_SKEW - timedelta(seconds=1))


def test_certificates_outside_their_validity_fail(authority: AttestationAuthority) -> None:
    """A document that claims to last a month still needs a signer certificate valid at valid_at."""
    signature = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW, ttl=timedelta(days=30))["signature"]

    assert verify(signature, authority, valid_at=NOW + timedelta(days=6)).vm_id == VM_ID
    with pytest.raises(AttestationError, match="does not chain to a trusted root at 2026-01-25"):
        verify(signature, authority, valid_at=NOW + timedelta(days=10))


def test_valid_at_must_be_timezone_aware(authority: AttestationAuthority) -> None:
    signature = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"]
    with pytest.raises(AttestationError, match="timezone-aware"):
        verify(signature, authority, valid_at=NOW.replace(tzinfo=None))


# ---- the intermediate


def test_without_the_intermediate_and_without_fetching_it_fails(authority: AttestationAuthority) -> None:
    signature = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"]
    with pytest.raises(AttestationError, match="fetching it is off"):
        verify(signature, authority, intermediates=())


def test_the_intermediate_is_fetched_from_the_caissuers_url_once(authority: AttestationAuthority) -> None:
    signature = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"]
    fetcher = RecordingFetcher(authority)

    assert verify(signature, authority, intermediates=(), fetch_issuer=fetcher).vm_id == VM_ID
    assert verify(signature, authority, intermediates=(), fetch_issuer=fetcher).vm_id == VM_ID
    assert fetcher.urls == [authority.issuer_url]  # the second time from the cache
    assert authority.issuer_url.startswith("http://www.microsoft.com/pkiops/certs/")

    clear_issuer_cache()
    verify(signature, authority, intermediates=(), fetch_issuer=fetcher)
    assert fetcher.urls == [authority.issuer_url] * 2


def test_no_fetch_when_a_known_intermediate_fits(authority: AttestationAuthority) -> None:
    fetcher = RecordingFetcher(authority)
    verify(authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"], authority, fetch_issuer=fetcher)
    assert fetcher.urls == []


def test_a_fetched_pem_is_accepted(authority: AttestationAuthority) -> None:
    fetcher = RecordingFetcher(authority, answer=authority.intermediates_pem())
    signature = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"]
    assert verify(signature, authority, intermediates=(), fetch_issuer=fetcher).vm_id == VM_ID


@pytest.mark.parametrize(
    "base",
    [
        "http://attacker.example/certs/",
        "http://www.microsoft.com.attacker.example/",
        "ftp://www.microsoft.com/pkiops/certs/",
        "http://www.microsoft.com:8080/pkiops/certs/",
        "http://user@www.microsoft.com/pkiops/certs/",
        "file:///etc/",
    ],
)
def test_a_caissuers_url_off_the_allow_list_is_not_fetched(base: str) -> None:
    authority = AttestationAuthority.generate(NOW, issuer_url_base=base)
    fetcher = RecordingFetcher(authority)

    with pytest.raises(AttestationError, match="so it was not fetched"):
        verify(
            authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"],
            authority,
            intermediates=(),
            fetch_issuer=fetcher,
        )
    assert fetcher.urls == []


def test_an_https_caissuers_url_on_the_allow_list_is_fetched() -> None:
    authority = AttestationAuthority.generate(NOW, issuer_url_base="https://cacerts.digicert.com/")
    fetcher = RecordingFetcher(authority)
    signature = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"]
    assert verify(signature, authority, intermediates=(), fetch_issuer=fetcher).vm_id == VM_ID
    assert fetcher.urls == [authority.issuer_url]


def test_an_unreachable_issuer_is_an_issuer_fetch_error(authority: AttestationAuthority) -> None:
    def unreachable(url: str) -> bytes:
        raise TimeoutError(f"connect to {url} timed out")

    signature = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"]
    with pytest.raises(IssuerFetchError, match=r"could not be fetched from http://www\.microsoft\.com/.*timed out"):
        verify(signature, authority, intermediates=(), fetch_issuer=unreachable)


@pytest.mark.parametrize("answer", [b"<html>Not found</html>", b"", b"\x30\x03\x02\x01\x00"])
def test_an_issuer_answer_that_is_no_certificate_fails(authority: AttestationAuthority, answer: bytes) -> None:
    fetcher = RecordingFetcher(authority, answer=answer)
    signature = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"]
    with pytest.raises(AttestationError, match="not a PEM bundle of certificates nor one DER certificate"):
        verify(signature, authority, intermediates=(), fetch_issuer=fetcher)


def test_the_wrong_certificate_at_the_caissuers_url_fails(
    authority: AttestationAuthority, stranger: AttestationAuthority
) -> None:
    fetcher = RecordingFetcher(authority, answer=stranger.intermediates_pem())
    signature = authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"]
    with pytest.raises(AttestationError, match="did not serve the signer's issuer"):
        verify(signature, authority, intermediates=(), fetch_issuer=fetcher)


# ---- hostile and malformed input


@pytest.mark.parametrize(
    "signature",
    ["", "   ", "not base64!", "QUJD", base64.b64encode(b"\x30\x80garbage").decode(), "A" * 10_000_000],
    ids=["empty", "blank", "not-base64", "three-bytes", "garbage-der", "ten-megabytes"],
)
def test_garbage_fails_cleanly(authority: AttestationAuthority, signature: str) -> None:
    with pytest.raises(AttestationError):
        verify(signature, authority)


def test_a_document_over_64_kib_is_refused_before_parsing(authority: AttestationAuthority) -> None:
    """Valid DER with 64 KiB of content: refused for its size, never parsed."""
    big = authority.sign_content(b'{"vmId": "' + b"x" * MAX_DOCUMENT_BYTES + b'"}')["signature"]
    assert len(base64.b64decode(big)) > MAX_DOCUMENT_BYTES
    with pytest.raises(AttestationError, match="more than a document of 65536 bytes can be"):
        verify(big, authority)


@pytest.mark.parametrize("value", [None, b"MIIB", 12345, ["MIIB"]])
def test_a_signature_that_is_no_string_fails(authority: AttestationAuthority, value: Any) -> None:
    with pytest.raises(AttestationError, match="must be a base64 string"):
        verify(value, authority)


def test_every_truncation_fails(authority: AttestationAuthority) -> None:
    der = der_of(authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW))
    roots = load_certificates(authority.roots_pem())
    accepted = []
    for length in range(1, len(der)):
        try:
            verify_attested_document(b64(der[:length]), roots=roots, valid_at=NOW)
        except AttestationError:
            continue
        accepted.append(length)
    assert accepted == []


def test_trailing_bytes_fail(authority: AttestationAuthority) -> None:
    der = der_of(authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW))
    with pytest.raises(AttestationError, match="not a well-formed DER CMS SignedData"):
        verify(b64(der + b"\x00"), authority)


def test_other_cms_content_types_fail(authority: AttestationAuthority) -> None:
    data = cms.ContentInfo({"content_type": "data", "content": b"{}"}).dump()
    with pytest.raises(AttestationError, match="is 'data', not signed data"):
        verify(b64(data), authority)


def _builder_document(authority: AttestationAuthority, *options: pkcs7.PKCS7Options, signers: int = 1) -> str:
    """A CMS document from cryptography's builder with the authority's signer (shapes IMDS never sends)."""
    key = authority.signer_key
    builder = pkcs7.PKCS7SignatureBuilder().set_data(attested_content(VM_ID, SUBSCRIPTION, NONCE, NOW))
    for _ in range(signers):
        builder = builder.add_signer(authority.signer, key, hashes.SHA256())
    return b64(builder.sign(serialization.Encoding.DER, [pkcs7.PKCS7Options.Binary, *options]))


def test_a_detached_signature_fails(authority: AttestationAuthority) -> None:
    signature = _builder_document(authority, pkcs7.PKCS7Options.DetachedSignature)
    with pytest.raises(AttestationError, match="embeds no content"):
        verify(signature, authority)


def test_a_document_without_certificates_fails(authority: AttestationAuthority) -> None:
    signature = _builder_document(authority, pkcs7.PKCS7Options.NoCerts)
    with pytest.raises(AttestationError, match="embeds no certificate"):
        verify(signature, authority)


def test_two_signers_fail(authority: AttestationAuthority) -> None:
    signature = _builder_document(authority, pkcs7.PKCS7Options.NoAttributes, signers=2)
    with pytest.raises(AttestationError, match="2 signers, not exactly one"):
        verify(signature, authority)


def test_a_builder_document_of_the_right_shape_verifies(authority: AttestationAuthority) -> None:
    """The control for the three above: the same builder, in IMDS's shape."""
    signature = _builder_document(authority, pkcs7.PKCS7Options.NoAttributes)
    assert verify(signature, authority).vm_id == VM_ID


# ---- the signed content


def _content(**fields: Any) -> bytes:
    document = json.loads(attested_content(VM_ID, SUBSCRIPTION, NONCE, NOW))
    document.update(fields)
    return json.dumps({k: v for k, v in document.items() if v is not None}).encode()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe not utf-8", "not JSON"),
        (b"not json", "not JSON"),
        (b'["vmId"]', "not a JSON object"),
        (_content(vmId=None), "no vmId"),
        (_content(vmId=42), "no vmId"),
        (_content(subscriptionId=None), "api-version 2019-04-30 or later"),
        (_content(subscriptionId=""), "no subscriptionId"),
        (_content(nonce=None), "no nonce"),
        (_content(timeStamp=None), "no timeStamp"),
        (_content(timeStamp={"createdOn": "01/15/26 12:00:00 -0000"}), r"no timeStamp\.expiresOn"),
        (
            _content(timeStamp={"createdOn": "2026-01-15T12:00:00Z", "expiresOn": "01/15/26 18:00:00 -0000"}),
            "not in IMDS's format",
        ),
        (
            _content(timeStamp={"createdOn": "01/15/26 12:00:00 -0000", "expiresOn": "01/15/26 11:00:00 -0000"}),
            "expires .* before it was created",
        ),
    ],
)
def test_signed_content_is_read_strictly(authority: AttestationAuthority, content: bytes, message: str) -> None:
    with pytest.raises(AttestationError, match=message):
        verify(authority.sign_content(content)["signature"], authority)


# ---- settings


def test_load_certificates_reads_a_pem_bundle_or_one_der(authority: AttestationAuthority) -> None:
    bundle = authority.roots_pem() + authority.intermediates_pem()
    assert load_certificates(bundle) == [authority.root, authority.intermediate]
    der = authority.root.public_bytes(serialization.Encoding.DER)
    assert load_certificates(der) == [authority.root]


@pytest.mark.parametrize("value", [b"", b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n", b"junk"])
def test_load_certificates_refuses_what_is_no_certificate(value: bytes) -> None:
    with pytest.raises(AttestationError, match="not a PEM bundle"):
        load_certificates(value)


def test_load_certificates_wants_bytes(authority: AttestationAuthority) -> None:
    with pytest.raises(AttestationError, match="must be bytes"):
        load_certificates(authority.roots_pem().decode())  # type: ignore[arg-type]


def test_no_roots_fails(authority: AttestationAuthority) -> None:
    with pytest.raises(AttestationError, match="no trusted roots"):
        verify(authority.sign(VM_ID, SUBSCRIPTION, NONCE, NOW)["signature"], authority, roots=())


# ---- the recorded document (tests/fixtures/azure/attested, scripts/regenerate_attested_fixture.py)


def _fixture() -> tuple[dict[str, str], list[x509.Certificate], list[x509.Certificate]]:
    answer = json.loads((FIXTURE / "document.json").read_text(encoding="utf-8"))
    roots = load_certificates((FIXTURE / "roots.pem").read_bytes())
    intermediates = load_certificates((FIXTURE / "intermediates.pem").read_bytes())
    return answer, roots, intermediates


def test_the_recorded_document_verifies_inside_its_window() -> None:
    answer, roots, intermediates = _fixture()
    assert set(answer) == {"encoding", "signature"}
    assert answer["encoding"] == "pkcs7"
    created = datetime(2026, 1, 15, 12, 0, 0, tzinfo=timezone.utc)

    for valid_at in (created - CLOCK_SKEW, created + timedelta(hours=1), created + ATTESTED_TTL):
        attested = verify_attested_document(
            answer["signature"], roots=roots, intermediates=intermediates, valid_at=valid_at
        )
        assert attested.vm_id == vm_id("vm-0")
        assert attested.subscription_id == SIM_SUBSCRIPTION_ID
        assert attested.nonce == "1234567890"
        assert (attested.created_on, attested.expires_on) == (created, created + ATTESTED_TTL)


@pytest.mark.parametrize(
    "valid_at",
    [
        datetime(2026, 1, 15, 11, 54, 59, tzinfo=timezone.utc),
        datetime(2026, 1, 15, 18, 0, 1, tzinfo=timezone.utc),
        datetime(2026, 11, 25, 0, 0, 0, tzinfo=timezone.utc),
    ],
    ids=["before-created", "after-expired", "months-later"],
)
def test_the_recorded_document_fails_outside_its_window(valid_at: datetime) -> None:
    answer, roots, intermediates = _fixture()
    with pytest.raises(AttestationError):
        verify_attested_document(answer["signature"], roots=roots, intermediates=intermediates, valid_at=valid_at)
