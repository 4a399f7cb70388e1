"""What a storm of forged attested documents costs the Azure app's verifier.

A forger cannot sign as Azure, but can make a signer certificate that names any issuer and any
caIssuers URL on Microsoft's host, and send it in as many messages as it likes. Each such message
must be refused without costing a fetch of its own, and without being handed back to the bus for
another try. The documents are forged with the simulator's CA (`AttestationAuthority`, a PKI of its
own, as a forger would make); the app's real `fetch_issuer` runs over a stand-in for
`requests.get` that counts the GETs and answers as told, so nothing leaves the machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from agent.proofs import AzureAttestedProver
from functions.azure_app import wiring
from functions.azure_app.settings import default_roots
from functions.trust.azure_attested import clear_issuer_cache
from functions.trust.verifiers import AzureAttestedVerifier, VmRecord
from simulator.attestation import AttestationAuthority
from tests.factories import azure_event
from tests.fixtures import FIXTURES
from tests.identity import microsoft_name
from wire.envelope import decode, encode, envelope_for_event
from wire.errors import RetryableError
from wire.identity import UnverifiedError
from wire.model import EventKind, EventStatus

NOW = datetime(2026, 1, 15, 12, 0, 0, tzinfo=timezone.utc)
VM_ID = "02aab8a4-74ef-476e-8182-f6d2ba4166a6"
SUBSCRIPTION = "8d10da13-8125-4ba9-a717-bf7490507b3d"
STORM = 20


class Answer:
    """A `requests` response as `fetch_issuer` reads it."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status_code = status
        self._body = body

    def __enter__(self) -> Answer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def iter_content(self, chunk_size: int) -> Iterator[bytes]:
        yield self._body


class CountingGet:
    """Stands in for `requests.get`: every GET is counted and answered with `status`."""

    def __init__(self, status: int, body: bytes = b"<html>Not Found</html>") -> None:
        self.status = status
        self.body = body
        self.urls: list[str] = []

    def __call__(self, url: str, **options: Any) -> Answer:
        self.urls.append(url)
        return Answer(self.status, self.body)


class Directory:
    def resource_of(self, subscription_id: str, vm_id: str) -> VmRecord | None:
        return VmRecord("web-0", f"/subscriptions/{subscription_id}/resourceGroups/rg/providers/x/web-0", vm_id)

    def named(self, name: str) -> list[VmRecord]:
        return []


class Imds:
    """The VM's IMDS as the agent's prover asks it, answering with the forger's documents."""

    def __init__(self, authority: AttestationAuthority) -> None:
        self._authority = authority

    def attested_document(self, nonce: str) -> str:
        return self._authority.sign(VM_ID, SUBSCRIPTION, nonce, NOW)["signature"]


@pytest.fixture(autouse=True)
def _fresh_issuer_cache() -> Iterator[None]:
    clear_issuer_cache()
    yield
    clear_issuer_cache()


def forged_messages(authority: AttestationAuthority, count: int) -> list[bytes]:
    prover = AzureAttestedProver(Imds(authority), lambda: 0.0)
    messages = []
    for number in range(count):
        event = azure_event(
            event_id=f"E-{number}", kind=EventKind.REBOOT, status=EventStatus.SCHEDULED, reporter="web-0"
        )
        messages.append(prover.prove(encode(envelope_for_event(event, NOW))))
    return messages


def storm(authority: AttestationAuthority, get: CountingGet, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Verify `STORM` forged messages as the app does; how many ended how."""
    monkeypatch.setattr("functions.azure_app.wiring.requests.get", get)
    verifier = AzureAttestedVerifier(
        roots=default_roots(), directory=Directory(), subscriptions=[SUBSCRIPTION], fetch_issuer=wiring.fetch_issuer
    )
    outcomes = {"verified": 0, "unverified": 0, "retryable": 0}
    accepted = NOW + timedelta(minutes=1)
    for body in forged_messages(authority, STORM):
        try:
            verifier.verify(decode(body), accepted, accepted)
            outcomes["verified"] += 1
        except UnverifiedError:
            outcomes["unverified"] += 1
        except RetryableError:
            outcomes["retryable"] += 1
    return outcomes


def test_forged_signers_under_an_issuer_azure_does_not_use_cost_no_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a forger's signer under its own issuing CA, whose caIssuers URL is on www.microsoft.com
    forger = AttestationAuthority.generate(NOW)
    get = CountingGet(404)

    outcomes = storm(forger, get, monkeypatch)

    # THEN every message is refused at once: no GET, nothing handed back for another try
    assert outcomes == {"verified": 0, "unverified": STORM, "retryable": 0}
    assert get.urls == []


def test_forged_signers_naming_a_shipped_azure_issuer_cost_no_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a signer that claims Azure's own issuing CA (whose certificate the verifier holds), with a
    # caIssuers URL of the forger's choosing on www.microsoft.com
    forger = AttestationAuthority.generate(
        NOW, intermediate_name=microsoft_name("Microsoft Azure RSA TLS Issuing CA 03")
    )
    get = CountingGet(404)

    outcomes = storm(forger, get, monkeypatch)

    # THEN the issuer it names did not sign it, which the verifier sees without fetching anything
    assert outcomes == {"verified": 0, "unverified": STORM, "retryable": 0}
    assert get.urls == []


def test_a_not_found_issuer_costs_one_fetch_and_no_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a signer naming one of Azure's issuing CAs that is not shipped (so it may be fetched),
    # at a URL that answers 404
    forger = AttestationAuthority.generate(NOW, intermediate_name=microsoft_name("Microsoft TLS G2 RSA CA OCSP 06"))
    get = CountingGet(404)

    outcomes = storm(forger, get, monkeypatch)

    # THEN one GET for the whole storm, and a 404 is an answer: unverified, not tried again
    assert outcomes == {"verified": 0, "unverified": STORM, "retryable": 0}
    assert get.urls == [forger.issuer_url]


def test_an_unavailable_issuer_is_retryable_but_fetched_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN the same, with Microsoft's server failing (503)
    forger = AttestationAuthority.generate(NOW, intermediate_name=microsoft_name("Microsoft TLS G2 RSA CA OCSP 06"))
    get = CountingGet(503)

    outcomes = storm(forger, get, monkeypatch)

    # THEN a failing server may recover, so the messages are tried again, but it is asked once
    assert outcomes == {"verified": 0, "unverified": 0, "retryable": STORM}
    assert get.urls == [forger.issuer_url]


def test_a_signer_naming_many_caissuers_urls_costs_at_most_one_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a signer listing ten caIssuers URLs on www.microsoft.com
    extra = [f"http://www.microsoft.com/pkiops/certs/forged-{n}.crt" for n in range(9)]
    forger = AttestationAuthority.generate(
        NOW, intermediate_name=microsoft_name("Microsoft TLS G2 RSA CA OCSP 06"), extra_issuer_urls=extra
    )
    get = CountingGet(404)

    outcomes = storm(forger, get, monkeypatch)

    # THEN only the first is asked, once
    assert outcomes["retryable"] == 0
    assert get.urls == [forger.issuer_url]


def _signed_by_azure() -> list[dict[str, str]]:
    documents = json.loads((FIXTURES / "azure" / "attested" / "signed_by_azure.json").read_text(encoding="utf-8"))
    assert isinstance(documents, list)
    return documents


@pytest.mark.parametrize("document", _signed_by_azure(), ids=lambda d: d["issuer"].split(",")[0][3:])
def test_documents_azure_signed_verify_without_any_fetch(document: dict[str, str]) -> None:
    # GIVEN a document Azure's IMDS signed (its signer under one of the shipped issuing CAs)
    from functions.trust.azure_attested import TIMESTAMP_FORMAT, verify_attested_document

    created = datetime.strptime(document["createdOn"], TIMESTAMP_FORMAT)
    fetched: list[str] = []

    def no_network(url: str) -> bytes:
        fetched.append(url)
        raise OSError(f"{url}: no network here")

    # WHEN it is checked with the app's default roots, no intermediates configured
    attested = verify_attested_document(
        document["signature"],
        roots=default_roots(),
        valid_at=created + timedelta(minutes=1),
        fetch_issuer=no_network,
    )

    # THEN it verifies from the shipped issuing CAs alone
    assert attested.signer.endswith("metadata.azure.com")
    assert fetched == []
