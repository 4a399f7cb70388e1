"""GCE instance identity tokens: what verifies, what is refused and why, with tokens signed by the
simulator's issuer (real RSA keys and certificates) and a recorded token of the real format."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest

pytest.importorskip("google.auth", reason="google-auth is not installed (the 3.9 compatibility run omits it)")

from cryptography.hazmat.primitives import serialization
from google.auth import crypt, jwt

from functions.trust.gce_token import (
    MAX_TOKEN_BYTES,
    GceIdentity,
    StaticCerts,
    TokenError,
    TokenExpiredError,
    verify_identity_token,
    verify_with_source,
)
from scripts.regenerate_identity_fixture import AUDIENCE as FIXTURE_AUDIENCE
from scripts.regenerate_identity_fixture import CREATED_AT, ISSUED_AT, VM_NAME
from simulator.gce_identity import SigningKey, TokenIssuer
from tests.fixtures import FIXTURES, fixture_json, fixture_text

AUDIENCE = "maintenance-bridge/" + "ab" * 32
VM: dict[str, Any] = {
    "instance_name": "gce-vm-7",
    "instance_id": "1234567890123456789",
    "project_id": "prod-project",
    "project_number": "123456789012",
    "zone": "europe-west1-b",
}
BASE64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

# google-auth's functions carry no annotations; these names give them the types they document.
signer_from_pem: Callable[..., crypt.Signer] = crypt.RSASigner.from_string
encode_jwt: Callable[..., bytes] = jwt.encode
decode_jwt: Callable[..., dict[str, Any]] = jwt.decode
decode_header: Callable[[str], dict[str, Any]] = jwt.decode_header


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


@pytest.fixture(scope="module")
def issuer() -> TokenIssuer:
    return TokenIssuer.generate()


@pytest.fixture(scope="module")
def stranger() -> TokenIssuer:
    """Another run's keys: not trusted."""
    return TokenIssuer.generate()


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def issue(issuer: TokenIssuer, at: datetime, audience: str = AUDIENCE, full: bool = True) -> str:
    return issuer.issue(audience, full=full, now=at, **VM)


def verify(token: str, issuer: TokenIssuer, **overrides: Any) -> GceIdentity:
    now = utcnow()
    arguments: dict[str, Any] = {"certs": issuer.certs(), "audience": AUDIENCE, "valid_at": now, "now": now}
    arguments.update(overrides)
    return verify_identity_token(token, **arguments)


def sign(claims: dict[str, Any], key: SigningKey, kid: str | None = None, header: dict[str, str] | None = None) -> str:
    """A token with any claims, signed by `key` (as `kid`): what a forger or a broken issuer sends."""
    pem = key.private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    signer = signer_from_pem(pem, key_id=kid or key.kid)
    return encode_jwt(signer, claims, header=header).decode("ascii")


def documented_claims(at: datetime, **overrides: Any) -> dict[str, Any]:
    issued = int(at.timestamp())
    claims: dict[str, Any] = {
        "iss": "https://accounts.google.com",
        "iat": issued,
        "exp": issued + 3600,
        "aud": AUDIENCE,
        "sub": "101234567890123456789",
        "azp": "101234567890123456789",
        "google": {
            "compute_engine": {
                "project_id": VM["project_id"],
                "project_number": int(VM["project_number"]),
                "zone": VM["zone"],
                "instance_id": VM["instance_id"],
                "instance_name": VM["instance_name"],
                "instance_creation_timestamp": issued - 86400,
            }
        },
    }
    claims.update(overrides)
    return claims


def refusal(token: str, issuer: TokenIssuer, **overrides: Any) -> str:
    with pytest.raises(TokenError) as caught:
        verify(token, issuer, **overrides)
    return str(caught.value)


# --------------------------------------------------------------------------- what verifies


def test_a_full_token_verifies_and_names_its_vm(issuer: TokenIssuer) -> None:
    # GIVEN a format=full token issued a second ago
    now = utcnow()
    token = issue(issuer, now - timedelta(seconds=1))
    # WHEN it is verified
    identity = verify(token, issuer, valid_at=now, now=now)
    # THEN it names the VM, the audience and the hour it is valid for
    assert identity.instance_name == "gce-vm-7"
    assert identity.instance_id == "1234567890123456789"
    assert identity.project_id == "prod-project"
    assert identity.zone == "europe-west1-b"
    assert identity.audience == AUDIENCE
    assert identity.expires_at - identity.issued_at == timedelta(hours=1)
    assert identity.issued_at == datetime.fromtimestamp(int((now - timedelta(seconds=1)).timestamp()), timezone.utc)


def test_a_token_valid_when_the_bus_accepted_it_is_accepted_after_it_expired(issuer: TokenIssuer) -> None:
    # GIVEN a token issued 2 hours ago, attached to a message the bus accepted 10 minutes later
    now = utcnow()
    token = issue(issuer, now - timedelta(hours=2))
    accepted = now - timedelta(hours=2) + timedelta(minutes=10)
    # WHEN it is verified now, an hour after it expired, at the moment of acceptance
    identity = verify(token, issuer, valid_at=accepted, now=now)
    # THEN it is accepted
    assert identity.expires_at < now
    assert identity.instance_name == "gce-vm-7"


def test_the_short_issuer_form_is_accepted(issuer: TokenIssuer) -> None:
    # GIVEN a token whose iss is the documented short form
    token = sign(documented_claims(utcnow(), iss="accounts.google.com"), issuer.keys[0])
    # THEN it verifies
    assert verify(token, issuer).project_id == "prod-project"


def test_a_token_signed_with_the_second_published_key_verifies(issuer: TokenIssuer) -> None:
    # GIVEN a token signed with another key of the trusted set (Google publishes more than one)
    token = sign(documented_claims(utcnow()), issuer.keys[1])
    # THEN the key is picked by its id
    assert verify(token, issuer).instance_name == "gce-vm-7"


def test_allowed_projects_accept_the_vms_project(issuer: TokenIssuer) -> None:
    token = issue(issuer, utcnow())
    assert verify(token, issuer, allowed_projects={"prod-project", "other"}).project_id == "prod-project"


# --------------------------------------------------------------------------- tampering and forgery


def tampered_copies(token: str) -> list[tuple[int, str]]:
    """One copy per position and per replacement: the character's lowest bit flipped (the bits a
    lenient decoder may ignore) and its highest (the bits that change the bytes); '.' becomes 'A'."""
    copies = []
    for position, character in enumerate(token):
        if character == ".":
            replacements = ["A"]
        else:
            index = BASE64URL.index(character)
            replacements = [BASE64URL[index ^ 1], BASE64URL[index ^ 32]]
        copies += [(position, token[:position] + r + token[position + 1 :]) for r in replacements]
    return copies


def test_changing_any_single_character_of_the_token_is_refused(issuer: TokenIssuer) -> None:
    # GIVEN a valid token of about 1 KiB
    token = issue(issuer, utcnow())
    assert verify(token, issuer).instance_name == "gce-vm-7"
    copies = tampered_copies(token)
    # WHEN each character is changed in turn, two ways
    accepted = []
    for position, copy in copies:
        try:
            verify(copy, issuer)
        except TokenError:
            continue
        accepted.append(position)
    # THEN every copy is refused with a TokenError (anything else would have propagated)
    assert len(copies) == 2 * len(token) - token.count(".")
    assert accepted == []


def test_a_token_signed_by_another_key_under_a_trusted_key_id_is_refused(
    issuer: TokenIssuer, stranger: TokenIssuer
) -> None:
    # GIVEN a token signed by an untrusted key, claiming the trusted key's id
    token = sign(documented_claims(utcnow()), stranger.keys[0], kid=issuer.keys[0].kid)
    # THEN the signature check refuses it
    assert "signature does not verify" in refusal(token, issuer)


def test_a_token_of_an_unknown_key_id_is_refused(issuer: TokenIssuer, stranger: TokenIssuer) -> None:
    # GIVEN a token signed by a key the trusted set does not have
    token = issue(stranger, utcnow())
    # THEN it is refused naming the key, and saying to refresh the certificates
    message = refusal(token, issuer)
    assert stranger.keys[0].kid in message
    assert "refresh the certificates" in message


@pytest.mark.parametrize("iss", ["https://evil.example", "https://accounts.google.com/", None, ["accounts.google.com"]])
def test_a_token_issued_by_someone_else_is_refused(issuer: TokenIssuer, iss: object) -> None:
    token = sign(documented_claims(utcnow(), iss=iss), issuer.keys[0])
    assert "not by Google" in refusal(token, issuer)


@pytest.mark.parametrize("algorithm", ["HS256", "none", "ES256", "RS512"])
def test_a_token_with_another_algorithm_is_refused(issuer: TokenIssuer, algorithm: str) -> None:
    token = sign(documented_claims(utcnow()), issuer.keys[0], header={"alg": algorithm})
    assert "not RS256" in refusal(token, issuer)


def test_a_token_without_a_key_id_is_refused(issuer: TokenIssuer) -> None:
    _header, payload, signature = sign(documented_claims(utcnow()), issuer.keys[0]).split(".")
    bare = b64(json.dumps({"alg": "RS256", "typ": "JWT"}).encode())
    token = ".".join([bare, payload, signature])
    assert "no key id" in refusal(token, issuer)


# --------------------------------------------------------------------------- audience, time, claims


def test_a_token_for_another_audience_is_refused(issuer: TokenIssuer) -> None:
    token = issue(issuer, utcnow(), audience="maintenance-bridge/" + "cd" * 32)
    assert "not for audience" in refusal(token, issuer)


def test_a_token_expired_when_the_bus_accepted_the_message_is_refused(issuer: TokenIssuer) -> None:
    # GIVEN a token issued 2 hours ago, attached to a message accepted 30 minutes ago
    now = utcnow()
    token = issue(issuer, now - timedelta(hours=2))
    # THEN it had expired at acceptance, which the error's kind says (the functions name the recovery then)
    with pytest.raises(TokenExpiredError) as caught:
        verify(token, issuer, valid_at=now - timedelta(minutes=30), now=now)
    assert "expired" in str(caught.value)
    assert "fresh token" in str(caught.value)


def test_a_token_issued_after_the_message_was_accepted_is_refused(issuer: TokenIssuer) -> None:
    now = utcnow()
    token = issue(issuer, now)
    assert "after the message was accepted" in refusal(token, issuer, valid_at=now - timedelta(minutes=5), now=now)


def test_times_within_the_skew_are_accepted(issuer: TokenIssuer) -> None:
    # GIVEN a token issued 20 s after acceptance, and one that expired 20 s before it (skew 30 s)
    now = utcnow()
    early = issue(issuer, now)
    late = issue(issuer, now - timedelta(hours=1, seconds=20))
    # THEN both verify
    assert verify(early, issuer, valid_at=now - timedelta(seconds=20), now=now).instance_name == "gce-vm-7"
    assert verify(late, issuer, valid_at=now, now=now).instance_name == "gce-vm-7"


def test_an_acceptance_time_after_now_is_refused(issuer: TokenIssuer) -> None:
    now = utcnow()
    assert "check the clocks" in refusal(issue(issuer, now), issuer, valid_at=now + timedelta(minutes=5), now=now)


def test_a_standard_format_token_is_refused_with_what_to_request(issuer: TokenIssuer) -> None:
    # GIVEN a token requested without format=full (no google.compute_engine)
    token = issue(issuer, utcnow(), full=False)
    # THEN it is refused, saying to request format=full
    assert "format=full" in refusal(token, issuer)


@pytest.mark.parametrize("field", ["instance_name", "instance_id", "project_id", "zone"])
@pytest.mark.parametrize("value", [None, "", 42, ["x"]])
def test_a_missing_or_mistyped_vm_field_is_refused(issuer: TokenIssuer, field: str, value: object) -> None:
    claims = documented_claims(utcnow())
    if value is None:
        del claims["google"]["compute_engine"][field]
    else:
        claims["google"]["compute_engine"][field] = value
    assert f"google.compute_engine.{field}" in refusal(sign(claims, issuer.keys[0]), issuer)


@pytest.mark.parametrize(
    ("claim", "value"), [("iat", 1.5e9), ("exp", "soon"), ("iat", True), ("exp", None), ("exp", float("inf"))]
)
def test_times_that_are_not_whole_seconds_are_refused(issuer: TokenIssuer, claim: str, value: object) -> None:
    claims = documented_claims(utcnow())
    claims[claim] = value
    if value is None:
        del claims[claim]
    with pytest.raises(TokenError):
        verify(sign(claims, issuer.keys[0]), issuer)


def test_a_project_not_allowed_is_refused(issuer: TokenIssuer) -> None:
    message = refusal(issue(issuer, utcnow()), issuer, allowed_projects={"staging-project"})
    assert "'prod-project'" in message
    assert "staging-project" in message


def test_allowed_projects_given_as_one_string_are_refused_not_matched_as_a_substring(issuer: TokenIssuer) -> None:
    assert "not one string" in refusal(issue(issuer, utcnow()), issuer, allowed_projects="prod-project-and-more")


# --------------------------------------------------------------------------- not tokens at all


@pytest.mark.parametrize(
    "token",
    [
        "",
        "not a token",
        "a.b",
        "a.b.c.d",
        "....",
        "e30.e30.e30",  # {} . {} . {}
        "eyJhbGciOiJSUzI1NiJ9.%%%.abc",
        "ey\u00e9.e30.e30",
        "\ud800.e30.e30",
        "A" * (MAX_TOKEN_BYTES + 1),
        "x" * 10_000_000,
    ],
)
def test_garbage_is_refused_with_a_token_error(issuer: TokenIssuer, token: str) -> None:
    with pytest.raises(TokenError):
        verify(token, issuer)


def test_a_deeply_nested_header_is_refused_with_a_token_error(issuer: TokenIssuer) -> None:
    # GIVEN a header of nested JSON arrays, deeper than Python's recursion limit, within the size bound
    nested = b64(b"[" * 5000 + b"]" * 5000)
    # THEN the parser's RecursionError comes out as a TokenError
    with pytest.raises(TokenError):
        verify(f"{nested}.e30.e30", issuer)


def test_an_oversized_token_is_refused_for_its_size(issuer: TokenIssuer) -> None:
    assert "16 KiB" in refusal("A" * (MAX_TOKEN_BYTES + 1), issuer)


@pytest.mark.parametrize("token", [None, b"e30.e30.e30", 42])
def test_a_token_that_is_not_text_is_refused(issuer: TokenIssuer, token: object) -> None:
    with pytest.raises(TokenError):
        verify(token, issuer)  # type: ignore[arg-type]


def test_an_empty_certificate_set_or_audience_is_refused(issuer: TokenIssuer) -> None:
    token = issue(issuer, utcnow())
    assert "no certificates" in refusal(token, issuer, certs={})
    assert "no audience" in refusal(token, issuer, audience="")


def test_a_naive_time_is_refused(issuer: TokenIssuer) -> None:
    with pytest.raises(TokenError):
        verify(issue(issuer, utcnow()), issuer, valid_at=datetime.now())


# --------------------------------------------------------------------------- the recorded token


def fixture_token() -> str:
    return fixture_text("gce/identity/token.jwt")


def verify_fixture(valid_at: datetime) -> GceIdentity:
    certs = StaticCerts.from_file(FIXTURES / "gce/identity/certs.json")
    return verify_with_source(fixture_token(), source=certs, audience=FIXTURE_AUDIENCE, valid_at=valid_at, now=utcnow())


def test_the_recorded_token_has_the_documented_shape() -> None:
    # GIVEN the recorded token and certificate set
    token = fixture_token()
    header = decode_header(token)
    claims = decode_jwt(token, verify=False)
    certs = fixture_json("gce/identity/certs.json")
    # THEN the header names an RS256 key of the set, and the claims are exactly the documented ones
    assert header["alg"] == "RS256"
    assert header["kid"] in certs
    assert set(claims) == {"iss", "iat", "exp", "aud", "sub", "azp", "google"}
    assert claims["exp"] - claims["iat"] == 3600
    assert claims["sub"] == claims["azp"]
    assert set(claims["google"]["compute_engine"]) == {
        "project_id",
        "project_number",
        "zone",
        "instance_id",
        "instance_name",
        "instance_creation_timestamp",
    }
    assert isinstance(claims["google"]["compute_engine"]["project_number"], int)
    assert claims["google"]["compute_engine"]["instance_creation_timestamp"] == int(CREATED_AT.timestamp())
    assert not token.endswith("\n")


def test_the_recorded_token_verifies_within_its_hour() -> None:
    # WHEN the recorded token is verified as accepted 30 minutes after it was issued
    identity = verify_fixture(ISSUED_AT + timedelta(minutes=30))
    # THEN it names the simulator's default VM
    assert identity.instance_name == VM_NAME
    assert identity.project_id == "maintenance-bridge-sim"
    assert identity.zone == "us-central1-a"
    assert identity.issued_at == ISSUED_AT
    assert identity.expires_at == ISSUED_AT + timedelta(hours=1)


@pytest.mark.parametrize(
    ("valid_at", "why"),
    [
        (ISSUED_AT + timedelta(hours=1, minutes=1), "expired"),
        (ISSUED_AT - timedelta(minutes=1), "after the message was accepted"),
    ],
)
def test_the_recorded_token_is_refused_outside_its_hour(valid_at: datetime, why: str) -> None:
    with pytest.raises(TokenError, match=why):
        verify_fixture(valid_at)


# --------------------------------------------------------------------------- StaticCerts


@pytest.mark.parametrize(
    "document", [{}, [], {"kid": 42}, {"kid": "not a certificate"}, "text", {"kid": ["-----BEGIN CERTIFICATE-----"]}]
)
def test_static_certs_refuse_what_is_not_a_certificate_set(document: Any) -> None:
    with pytest.raises(TokenError):
        StaticCerts(document)


def test_static_certs_from_an_unreadable_file_raise_a_token_error(tmp_path: Any) -> None:
    (tmp_path / "certs.json").write_text("{not json")
    with pytest.raises(TokenError, match="cannot read"):
        StaticCerts.from_file(tmp_path / "certs.json")
    with pytest.raises(TokenError, match="cannot read"):
        StaticCerts.from_file(tmp_path / "missing.json")
