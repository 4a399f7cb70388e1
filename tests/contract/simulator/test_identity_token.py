"""GCE instance identity tokens over real HTTP, as the docs say a VM gets them:
GET instance/service-accounts/default/identity?audience=AUD&format=full with Metadata-Flavor: Google.

The Simulator does not expose its token issuer, so the signature is verified in
tests/unit/agent/test_simulator_identity.py (a GceApi with a known issuer); here the token's
header and claims are read with google-auth without verification and held to the values the same
VM serves."""

from __future__ import annotations

from typing import Any, Callable

import pytest

pytest.importorskip("google.auth", reason="google-auth is not installed (the 3.9 compatibility run omits it)")

from google.auth import jwt

from tests.contract.simulator.conftest import FLAVOR, StartSim, VmClient, clients

IDENTITY = "instance/service-accounts/default/identity"
AUDIENCE = "maintenance-bridge/" + "5a" * 32

# google-auth's functions carry no annotations; these names give them the types they document.
decode_jwt: Callable[..., dict[str, Any]] = jwt.decode
decode_header: Callable[[str], dict[str, Any]] = jwt.decode_header


def token_of(vm: VmClient, **params: str) -> str:
    response = vm.gce(IDENTITY, params={"audience": AUDIENCE, "format": "full", **params})
    assert response.status_code == 200, response.text
    return response.text


def test_a_full_token_names_this_vm_with_the_values_it_serves(gce: VmClient) -> None:
    # WHEN a VM asks for its identity token as the docs show
    response = gce.gce(IDENTITY, params={"audience": AUDIENCE, "format": "full", "licenses": "FALSE"})
    # THEN a signed JWT comes as text/html with Metadata-Flavor
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/html")
    assert response.headers["Metadata-Flavor"] == "Google"
    header = decode_header(response.text)
    assert header["alg"] == "RS256"
    assert header["kid"]
    # ... whose claims are the documented ones, for this audience, naming this VM as the server does
    claims = decode_jwt(response.text, verify=False)
    compute = claims["google"]["compute_engine"]
    assert claims["iss"] == "https://accounts.google.com"
    assert claims["aud"] == AUDIENCE
    assert claims["exp"] - claims["iat"] == 3600
    assert compute["instance_name"] == gce.gce("instance/name").text
    assert compute["instance_id"] == gce.gce("instance/id").text
    assert compute["project_id"] == gce.gce("project/project-id").text
    assert str(compute["project_number"]) == gce.gce("project/numeric-project-id").text
    assert gce.gce("instance/zone").text.endswith(f"/zones/{compute['zone']}")


def test_each_vm_gets_its_own_token_signed_with_the_same_key(start_sim: StartSim) -> None:
    # GIVEN two VMs of one simulator
    first, second = clients(start_sim(cloud="gce", vm_names=["g-0", "g-1"]))
    # WHEN both ask for a token
    tokens = [token_of(vm) for vm in (first, second)]
    # THEN each names itself, and one run's key signed both
    names = [decode_jwt(token, verify=False)["google"]["compute_engine"]["instance_name"] for token in tokens]
    assert names == ["g-0", "g-1"]
    assert decode_header(tokens[0])["kid"] == decode_header(tokens[1])["kid"]


def test_the_default_format_is_standard_without_vm_details(gce: VmClient) -> None:
    response = gce.gce(IDENTITY, params={"audience": AUDIENCE})
    assert response.status_code == 200
    claims = decode_jwt(response.text, verify=False)
    assert set(claims) == {"iss", "iat", "exp", "aud", "sub", "azp"}


@pytest.mark.parametrize("params", [{}, {"audience": ""}, {"format": "full"}])
def test_a_request_without_an_audience_is_400(gce: VmClient, params: dict[str, str]) -> None:
    # WHEN the audience is missing or empty
    response = gce.gce(IDENTITY, params=params)
    # THEN 400 with GCE's message, as plain text with Metadata-Flavor
    assert response.status_code == 400
    assert response.text.strip() == "non-empty audience parameter required"
    assert response.headers["Metadata-Flavor"] == "Google"


@pytest.mark.parametrize("headers", [{}, {"Metadata-Flavor": "google"}, {**FLAVOR, "X-Forwarded-For": "203.0.113.7"}])
def test_a_request_without_the_flavor_header_or_through_a_proxy_is_403(gce: VmClient, headers: dict[str, str]) -> None:
    # WHEN the header is missing or wrong, or the request was proxied
    response = gce.gce(IDENTITY, params={"audience": AUDIENCE, "format": "full"}, headers=headers)
    # THEN 403 and no token
    assert response.status_code == 403
    assert "eyJ" not in response.text


def test_a_token_is_new_at_every_request(gce: VmClient) -> None:
    first = token_of(gce)
    second = token_of(gce, audience=AUDIENCE + "0")
    assert first != second
    assert decode_jwt(second, verify=False)["aud"] == AUDIENCE + "0"
