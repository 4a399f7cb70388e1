"""The bounds on what checking one attested document may cost: certificates read, fetches made.

Documents are forged with the simulator's CA under one of Azure's issuing CA names that is not
shipped (so fetching it is allowed); `fetch_issuer` is a counting stand-in, and the clock of the
issuers' memory is a number the test moves.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.x509.oid import NameOID

from functions.trust.azure_attested import (
    AttestationError,
    IssuerFetchError,
    clear_issuer_cache,
    load_certificates,
    verify_attested_document,
)
from simulator.attestation import AttestationAuthority, attested_content

NOW = datetime(2026, 1, 15, 12, 0, 0, tzinfo=timezone.utc)
VM_ID = "02aab8a4-74ef-476e-8182-f6d2ba4166a6"
SUBSCRIPTION = "8d10da13-8125-4ba9-a717-bf7490507b3d"
NOT_SHIPPED = x509.Name(
    [
        x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Microsoft Corporation"),
        x509.NameAttribute(NameOID.COMMON_NAME, "Microsoft TLS G2 RSA CA OCSP 06"),
    ]
)


@pytest.fixture(scope="module")
def azure() -> AttestationAuthority:
    """Stands in for Azure's PKI: the roots the verifier trusts."""
    return AttestationAuthority.generate(NOW)


@pytest.fixture(scope="module")
def forger() -> AttestationAuthority:
    return AttestationAuthority.generate(NOW, intermediate_name=NOT_SHIPPED)


@pytest.fixture(autouse=True)
def _fresh_issuer_cache() -> Iterator[None]:
    clear_issuer_cache()
    yield
    clear_issuer_cache()


class Fetcher:
    """Counts the URLs asked for; answers with `answer` or raises `error`."""

    def __init__(self, answer: bytes = b"", error: Exception | None = None) -> None:
        self.answer = answer
        self.error = error
        self.urls: list[str] = []

    def __call__(self, url: str) -> bytes:
        self.urls.append(url)
        if self.error is not None:
            raise self.error
        return self.answer


def check(signature: str, roots: AttestationAuthority, **options: Any) -> Any:
    return verify_attested_document(
        signature, roots=load_certificates(roots.roots_pem()), valid_at=NOW + timedelta(minutes=1), **options
    )


def test_an_answer_that_did_not_issue_the_signer_is_not_fetched_again(
    azure: AttestationAuthority, forger: AttestationAuthority
) -> None:
    # GIVEN a caIssuers URL that serves a certificate, not the one that issued the signer
    fetcher = Fetcher(answer=azure.intermediates_pem())
    signature = forger.sign(VM_ID, SUBSCRIPTION, "1", NOW)["signature"]

    # WHEN twenty documents of that signer are checked
    for _ in range(20):
        with pytest.raises(AttestationError, match="did not serve the signer's issuer") as refused:
            check(signature, azure, fetch_issuer=fetcher)
        assert not isinstance(refused.value, IssuerFetchError)

    # THEN the answer was fetched once and remembered
    assert fetcher.urls == [forger.issuer_url]


def test_a_document_embedding_more_certificates_than_the_bound_is_refused(forger: AttestationAuthority) -> None:
    # GIVEN a document that embeds its signer and five more certificates
    others = [AttestationAuthority.generate(NOW).root for _ in range(5)]
    builder = pkcs7.PKCS7SignatureBuilder().set_data(attested_content(VM_ID, SUBSCRIPTION, "1", NOW))
    builder = builder.add_signer(forger.signer, forger.signer_key, hashes.SHA256())
    for other in others:
        builder = builder.add_certificate(other)
    der = builder.sign(serialization.Encoding.DER, [pkcs7.PKCS7Options.Binary, pkcs7.PKCS7Options.NoAttributes])
    fetcher = Fetcher(error=OSError("unused"))

    # THEN it is refused before any chain is built or anything fetched
    with pytest.raises(AttestationError, match="embeds 6 certificates, more than 4"):
        check(
            base64.b64encode(der).decode("ascii"),
            forger,
            intermediates=load_certificates(forger.intermediates_pem()),
            fetch_issuer=fetcher,
        )
    assert fetcher.urls == []


def test_a_fetched_bundle_of_more_certificates_than_the_bound_is_refused(forger: AttestationAuthority) -> None:
    # GIVEN the caIssuers URL answers with the right issuer among five other certificates
    others = b"".join(AttestationAuthority.generate(NOW).roots_pem() for _ in range(5))
    fetcher = Fetcher(answer=forger.intermediates_pem() + others)
    signature = forger.sign(VM_ID, SUBSCRIPTION, "1", NOW)["signature"]

    # THEN that is no answer a caIssuers URL gives: refused for good, not retried
    with pytest.raises(AttestationError, match="6 certificates, more than 4") as refused:
        check(signature, forger, fetch_issuer=fetcher)
    assert not isinstance(refused.value, IssuerFetchError)


def test_a_failed_fetch_is_remembered_for_the_interval_then_tried_again(forger: AttestationAuthority) -> None:
    from functions.trust.azure_attested import FETCH_RETRY_AFTER, IssuerMemory

    # GIVEN an issuers' memory on a clock the test moves, and an issuer that cannot be reached
    now = [1000.0]
    memory = IssuerMemory(clock=lambda: now[0])
    fetcher = Fetcher(error=TimeoutError("timed out"))
    signature = forger.sign(VM_ID, SUBSCRIPTION, "1", NOW)["signature"]

    def attempt() -> None:
        with pytest.raises(IssuerFetchError):
            check(signature, forger, fetch_issuer=fetcher, issuer_memory=memory)

    # WHEN documents keep coming until just before the interval ends
    attempt()
    now[0] += FETCH_RETRY_AFTER - 1
    attempt()
    assert fetcher.urls == [forger.issuer_url]

    # THEN the next one after it asks again
    now[0] += 2
    attempt()
    assert fetcher.urls == [forger.issuer_url] * 2
