"""The simulator's GCE identity endpoint, answered by a real GceApi with an issuer whose
certificates the test holds: its tokens verify with the functions' verifier and name the VM.

(The contract tests in tests/contract/simulator/test_identity_token.py go over HTTP; the Simulator
does not expose its issuer, so the signature is checked here.)"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest

pytest.importorskip("google.auth", reason="google-auth is not installed (the 3.9 compatibility run omits it)")

from google.auth import jwt

from functions.trust.gce_token import GceIdentity, TokenError, verify_identity_token
from simulator.clock import Clock
from simulator.departures import Departures
from simulator.gce_api import (
    IDENTITY_PATH,
    PREFIX,
    PROJECT_ID,
    PROJECT_NUMBER,
    ZONE,
    GceApi,
    GceState,
    instance_id,
)
from simulator.gce_identity import TokenIssuer
from simulator.store import MetadataRequest, Response, SimLog, Timeline

VMS = ("gce-vm-0", "gce-vm-1")
AUDIENCE = "maintenance-bridge/" + "12" * 32
FLAVOR = {"metadata-flavor": "Google"}

# google-auth's decode carries no annotations; this name gives it the type it documents.
decode_jwt: Callable[..., dict[str, Any]] = jwt.decode


@pytest.fixture(scope="module")
def issuer() -> TokenIssuer:
    return TokenIssuer.generate()


def make_api(identity: TokenIssuer | None) -> GceApi:
    clock = Clock(1.0)
    cond = threading.Condition(threading.RLock())
    log = SimLog(clock, cond)
    departures = Departures(cond, Timeline(clock, cond), log, VMS, 1.0)
    return GceApi(GceState(clock, cond, log, VMS, departures), clock, cond, lambda vm: False, identity=identity)


def get(api: GceApi, query: Mapping[str, str], vm: str = "gce-vm-0", headers: Mapping[str, str] = FLAVOR) -> Response:
    request = MetadataRequest(method="GET", path=PREFIX + IDENTITY_PATH, query=query, headers=headers, body=b"", vm=vm)
    return api.handle(request)


def verified(token: str, issuer: TokenIssuer) -> GceIdentity:
    now = datetime.now(timezone.utc)
    return verify_identity_token(token, certs=issuer.certs(), audience=AUDIENCE, valid_at=now, now=now)


def test_a_full_token_verifies_with_the_issuers_certificates_and_names_the_vm(issuer: TokenIssuer) -> None:
    # GIVEN the endpoint of the second VM
    api = make_api(issuer)
    # WHEN it is asked for a format=full token
    response = get(api, {"audience": AUDIENCE, "format": "full", "licenses": "FALSE"}, vm="gce-vm-1")
    # THEN the token comes as text/html with Metadata-Flavor, verifies, and names that VM
    assert response.status == 200
    assert response.content_type.startswith("text/html")
    assert ("Metadata-Flavor", "Google") in response.headers
    identity = verified(response.body.decode("ascii"), issuer)
    assert identity.instance_name == "gce-vm-1"
    assert identity.instance_id == instance_id("gce-vm-1")
    assert identity.project_id == PROJECT_ID
    assert identity.zone == ZONE


def test_the_token_carries_the_values_the_metadata_server_serves(issuer: TokenIssuer) -> None:
    # WHEN a full token is issued
    token = get(make_api(issuer), {"audience": AUDIENCE, "format": "full"}).body.decode("ascii")
    claims = decode_jwt(token, certs=issuer.certs(), audience=AUDIENCE)
    compute = claims["google"]["compute_engine"]
    # THEN the project number is the served one (a JSON number), and the times are real and an hour apart
    assert compute["project_number"] == int(PROJECT_NUMBER)
    assert compute["instance_creation_timestamp"] <= claims["iat"]
    assert abs(claims["iat"] - datetime.now(timezone.utc).timestamp()) < 60
    assert claims["exp"] - claims["iat"] == 3600
    assert claims["iss"] == "https://accounts.google.com"


def test_every_request_gets_a_new_token_without_an_etag(issuer: TokenIssuer) -> None:
    api = make_api(issuer)
    first = get(api, {"audience": AUDIENCE, "format": "full"})
    second = get(api, {"audience": AUDIENCE + "0", "format": "full"})
    assert first.body != second.body
    assert not any(name == "ETag" for name, _ in first.headers)


def test_the_standard_format_is_the_default_and_names_no_vm(issuer: TokenIssuer) -> None:
    # WHEN a token is asked for without format
    token = get(make_api(issuer), {"audience": AUDIENCE}).body.decode("ascii")
    # THEN it has no google claims, and the verifier says to request format=full
    assert "google" not in decode_jwt(token, certs=issuer.certs(), audience=AUDIENCE)
    with pytest.raises(TokenError, match="format=full"):
        verified(token, issuer)


@pytest.mark.parametrize("query", [{}, {"audience": ""}, {"format": "full"}])
def test_no_audience_is_400_with_gces_message(issuer: TokenIssuer, query: dict[str, str]) -> None:
    response = get(make_api(issuer), query)
    assert response.status == 400
    assert response.body == b"non-empty audience parameter required\n"


@pytest.mark.parametrize("query", [{"format": "FULL"}, {"format": "json"}, {"licenses": "maybe"}])
def test_an_unknown_format_or_licenses_value_is_400(issuer: TokenIssuer, query: dict[str, str]) -> None:
    response = get(make_api(issuer), {"audience": AUDIENCE, **query})
    assert response.status == 400
    assert next(iter(query)).encode() in response.body


@pytest.mark.parametrize("headers", [{}, {"metadata-flavor": "google"}, {**FLAVOR, "x-forwarded-for": "10.0.0.1"}])
def test_the_metadata_servers_request_checks_come_first(issuer: TokenIssuer, headers: dict[str, str]) -> None:
    response = get(make_api(issuer), {"audience": AUDIENCE}, headers=headers)
    assert response.status == 403
    assert b"eyJ" not in response.body


def test_a_malformed_answer_is_a_cut_off_token(issuer: TokenIssuer) -> None:
    response = get(make_api(issuer), {"audience": AUDIENCE, "format": "full"})
    assert response.broken is not None
    assert response.body.startswith(response.broken)
    with pytest.raises(TokenError):
        verified(response.broken.decode("ascii"), issuer)


def test_without_an_issuer_one_is_made_when_first_needed_and_kept() -> None:
    # GIVEN an API made without an issuer
    api = make_api(None)
    # WHEN a token is issued, and the issuer read afterwards
    token = get(api, {"audience": AUDIENCE, "format": "full"}).body.decode("ascii")
    issuer = api.identity
    # THEN the same issuer signed it, and reading it again gives the same one
    assert verified(token, issuer).instance_name == "gce-vm-0"
    assert api.identity is issuer
    assert len(issuer.certs()) == 2


def test_the_issuer_is_read_only(issuer: TokenIssuer) -> None:
    api = make_api(issuer)
    assert api.identity is issuer
    with pytest.raises(AttributeError):
        api.identity = TokenIssuer.generate(key_count=1)  # type: ignore[misc]


def test_a_token_issued_long_ago_by_the_endpoint_is_refused_as_expired(issuer: TokenIssuer) -> None:
    # GIVEN a token from the endpoint, verified as if accepted two hours later
    token = get(make_api(issuer), {"audience": AUDIENCE, "format": "full"}).body.decode("ascii")
    later = datetime.now(timezone.utc) + timedelta(hours=2)
    # THEN it is refused (it had expired at acceptance)
    with pytest.raises(TokenError, match="expired"):
        verify_identity_token(token, certs=issuer.certs(), audience=AUDIENCE, valid_at=later, now=later)
