"""GET /metadata/attested/document over HTTP, as a VM asks IMDS for it.

The client follows the IMDS docs ("Attested data"): `Metadata: true`, an api-version of the attested
endpoint, an optional 10-digit nonce. The answer must verify with the simulator's roots and name the
VM whose port was asked, as the instance endpoint names it.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import requests

from functions.trust.azure_attested import AttestedDocument, load_certificates, verify_attested_document
from simulator import Simulator
from simulator.attestation import ATTESTED_TTL, AttestationAuthority
from simulator.azure_api import ATTESTED_NEWEST
from tests.contract.simulator.conftest import METADATA, TIMEOUT, StartSim, VmClient, clients

ATTESTED_VERSION = "2020-09-01"


def get_attested(
    client: VmClient,
    version: str | None = ATTESTED_VERSION,
    nonce: str | None = None,
    headers: dict[str, str] | None = None,
) -> requests.Response:
    params = {} if version is None else {"api-version": version}
    if nonce is not None:
        params["nonce"] = nonce
    return requests.get(
        f"{client.base_url}/metadata/attested/document",
        params=params,
        headers=METADATA if headers is None else headers,
        timeout=TIMEOUT,
    )


def authority_of(sim: Simulator) -> AttestationAuthority:
    # The Simulator does not expose its AzureApi; the router every VM port shares holds it.
    router = sim._servers[0].router
    assert router is not None
    return router._azure.attestation


def verified(answer: dict[str, Any], sim: Simulator) -> AttestedDocument:
    authority = authority_of(sim)
    return verify_attested_document(
        answer["signature"],
        roots=load_certificates(authority.roots_pem()),
        valid_at=datetime.now(timezone.utc),
        fetch_issuer=lambda url: authority.serve_issuer(url) or b"",
        issuer_names=(authority.intermediate.subject,),  # the simulator's, in place of Azure's
    )


def instance_value(client: VmClient, leaf: str) -> str:
    response = requests.get(
        f"{client.base_url}/metadata/instance/compute/{leaf}",
        params={"api-version": "2021-02-01", "format": "text"},
        headers=METADATA,
        timeout=TIMEOUT,
    )
    assert response.status_code == 200, response.text
    return response.text


def test_the_document_verifies_and_names_this_vm(start_sim: StartSim) -> None:
    sim = start_sim(cloud="azure")
    client = clients(sim)[0]

    response = get_attested(client, nonce="1234567890")

    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    answer = response.json()
    assert set(answer) == {"encoding", "signature"}
    assert answer["encoding"] == "pkcs7"
    attested = verified(answer, sim)
    assert attested.vm_id == instance_value(client, "vmId")
    assert attested.subscription_id == instance_value(client, "subscriptionId")
    assert attested.nonce == "1234567890"
    assert attested.signer == "metadata.azure.com"
    assert attested.expires_on - attested.created_on == ATTESTED_TTL
    assert abs(attested.created_on - datetime.now(timezone.utc)) < timedelta(minutes=1)


def test_each_vm_gets_its_own_vmid_from_one_authority(start_sim: StartSim) -> None:
    sim = start_sim(cloud="azure", vm_names=["vm-a", "vm-b"])

    vm_ids = []
    for client in clients(sim):
        response = get_attested(client)
        assert response.status_code == 200, response.text
        attested = verified(response.json(), sim)
        assert attested.vm_id == instance_value(client, "vmId")
        vm_ids.append(attested.vm_id)
    assert len(set(vm_ids)) == 2


def test_without_a_nonce_the_document_carries_the_time(start_sim: StartSim) -> None:
    sim = start_sim(cloud="azure")
    response = get_attested(clients(sim)[0])

    assert response.status_code == 200, response.text
    nonce = verified(response.json(), sim).nonce
    assert re.fullmatch(r"\d{8}-\d{6}", nonce)
    stamped = datetime.strptime(nonce, "%Y%m%d-%H%M%S").replace(tzinfo=timezone.utc)
    assert abs(stamped - datetime.now(timezone.utc)) < timedelta(minutes=1)


@pytest.mark.parametrize("version", ["2018-10-01", "2021-02-01", "2025-04-07"])
def test_the_attested_versions_are_served(azure: VmClient, version: str) -> None:
    assert get_attested(azure, version=version).status_code == 200


def test_a_missing_header_is_refused(azure: VmClient) -> None:
    response = get_attested(azure, headers={})
    assert response.status_code == 400
    assert response.json() == {"error": "Bad request. Required metadata header not specified"}


@pytest.mark.parametrize("version", [None, "2018-04-02", "2017-08-01", "2030-01-01", "latest"])
def test_a_version_without_the_attested_endpoint_is_refused(azure: VmClient, version: str | None) -> None:
    response = get_attested(azure, version=version)
    assert response.status_code == 400
    assert response.json()["newest-versions"] == list(ATTESTED_NEWEST)
    assert "api-version is invalid" in response.json()["error"]


@pytest.mark.parametrize("nonce", ["", "123456789", "12345678901", "12345abcde", "١٢٣٤٥٦٧٨٩٠", "12345 7890"])
def test_a_nonce_of_other_than_ten_digits_is_refused(azure: VmClient, nonce: str) -> None:
    response = get_attested(azure, nonce=nonce)
    assert response.status_code == 400
    assert "nonce must be a string of exactly 10 digits" in response.json()["error"]


def test_a_proxied_request_is_refused(azure: VmClient) -> None:
    response = get_attested(azure, headers={**METADATA, "X-Forwarded-For": "10.0.0.4"})
    assert response.status_code == 400
    assert "X-Forwarded-For" in response.json()["error"]


def test_only_get_is_allowed(azure: VmClient) -> None:
    response = requests.post(
        f"{azure.base_url}/metadata/attested/document",
        params={"api-version": ATTESTED_VERSION},
        headers=METADATA,
        timeout=TIMEOUT,
    )
    assert response.status_code == 405
