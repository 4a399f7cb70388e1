"""Ed25519 signatures of commands: canonical bytes, tampering, wrong keys, encodings, key formats."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from tests.peers import require_peer
from wire.commands import CommandType, decode_command, encode_command, new_command
from wire.signing import (
    BadSignatureError,
    KeyFormatError,
    SigningUnavailableError,
    generate_keypair,
    load_private_key,
    load_public_key,
    public_key_text,
    sign,
    sign_command,
    verify,
)

ISSUED = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def keypair() -> tuple[bytes, bytes]:
    return generate_keypair()


@pytest.fixture(scope="module")
def private_key(keypair: tuple[bytes, bytes]) -> ed25519.Ed25519PrivateKey:
    return load_private_key(keypair[0])


@pytest.fixture(scope="module")
def public_key(keypair: tuple[bytes, bytes]) -> ed25519.Ed25519PublicKey:
    return load_public_key(keypair[1])


def signed_body(private_key: ed25519.Ed25519PrivateKey) -> bytes:
    command = new_command(CommandType.APPROVE, target="vm-0", event_id="E1", issued_at=ISSUED)
    return encode_command(sign_command(command, private_key))


def test_a_signed_command_verifies_over_its_received_canonical_bytes(
    private_key: ed25519.Ed25519PrivateKey, public_key: ed25519.Ed25519PublicKey
) -> None:
    # GIVEN a command signed by the functions
    received = decode_command(signed_body(private_key))
    assert received.command.signature is not None

    # WHEN the agent verifies it THEN nothing is raised
    verify(received.canonical, received.command.signature, public_key)


def test_signature_is_unpadded_base64url_of_64_bytes(private_key: ed25519.Ed25519PrivateKey) -> None:
    signature = sign(b"anything", private_key)
    assert "=" not in signature
    assert "+" not in signature
    assert "/" not in signature
    assert len(base64.urlsafe_b64decode(signature + "==")) == 64


def test_signature_covers_exactly_the_documented_canonical_form(
    private_key: ed25519.Ed25519PrivateKey, public_key: ed25519.Ed25519PublicKey
) -> None:
    # GIVEN a signed command, and its canonical bytes rebuilt by hand as docs/commands.md says
    document = json.loads(signed_body(private_key))
    signature = document.pop("signature")
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    # THEN the signature verifies over those bytes, with the raw Ed25519 primitive
    public_key.verify(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)), canonical)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("target", "vm-1"),
        ("event_id", "E2"),
        ("type", "drain"),
        ("expires_at", "2024-05-02T12:00:00Z"),
        ("execute_at", "2024-05-01T12:05:00Z"),
    ],
)
def test_a_tampered_field_fails_verification(
    private_key: ed25519.Ed25519PrivateKey, public_key: ed25519.Ed25519PublicKey, field: str, value: str
) -> None:
    # GIVEN a signed command of which one field was changed (or added) in transit
    document = json.loads(signed_body(private_key))
    document[field] = value
    received = decode_command(json.dumps(document).encode())
    assert received.command.signature is not None

    # THEN verification fails and says why
    with pytest.raises(BadSignatureError, match="does not match"):
        verify(received.canonical, received.command.signature, public_key)


def test_a_signature_by_another_key_fails(public_key: ed25519.Ed25519PublicKey) -> None:
    # GIVEN a command signed with a key the agent does not trust
    other_private = load_private_key(generate_keypair()[0])
    received = decode_command(signed_body(other_private))
    assert received.command.signature is not None

    with pytest.raises(BadSignatureError, match="signed with another key"):
        verify(received.canonical, received.command.signature, public_key)


def test_padded_signatures_are_accepted(
    private_key: ed25519.Ed25519PrivateKey, public_key: ed25519.Ed25519PublicKey
) -> None:
    # GIVEN the signature written with base64 padding
    signature = sign(b"payload", private_key)
    padded = signature + "=" * (-len(signature) % 4)
    assert padded != signature

    # THEN it verifies as well as the unpadded form
    verify(b"payload", padded, public_key)
    verify(b"payload", signature, public_key)


@pytest.mark.parametrize("text", ["not base64!", "AAAA", "a+b/" * 22, ""])
def test_signatures_that_do_not_decode_to_64_bytes_are_bad(public_key: ed25519.Ed25519PublicKey, text: str) -> None:
    with pytest.raises(BadSignatureError, match="not base64url text of a 64-byte"):
        verify(b"payload", text, public_key)


def test_raw_keys_load_from_base64_and_base64url_text(
    private_key: ed25519.Ed25519PrivateKey, public_key: ed25519.Ed25519PublicKey
) -> None:
    # GIVEN the raw 32-byte keys as text, in both alphabets, padded and not
    raw_private = private_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    raw_public = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    texts = [
        base64.b64encode(raw_public).decode(),
        base64.urlsafe_b64encode(raw_public).decode().rstrip("="),
        public_key_text(public_key),
    ]

    # THEN each loads to the same key, and a signature made with the raw private key verifies
    for text in texts:
        loaded = load_public_key(text)
        assert loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) == raw_public
    signer = load_private_key(base64.b64encode(raw_private).decode())
    verify(b"payload", sign(b"payload", signer), load_public_key(texts[1]))


def test_keys_load_from_files_given_as_paths_or_text(keypair: tuple[bytes, bytes], tmp_path: Path) -> None:
    # GIVEN the PEM keys in files
    private_file = tmp_path / "signing.pem"
    public_file = tmp_path / "verify.pem"
    private_file.write_bytes(keypair[0])
    public_file.write_bytes(keypair[1])

    # WHEN they are loaded by Path and by path text
    signer = load_private_key(private_file)
    verifier = load_public_key(str(public_file))

    # THEN they form a working pair
    verify(b"payload", sign(b"payload", signer), verifier)


def test_openssl_generated_keys_load(tmp_path: Path) -> None:
    # GIVEN a key pair made with openssl as docs/commands.md shows (skipped where openssl is absent)
    openssl = "openssl"
    try:
        subprocess.run(
            [openssl, "genpkey", "-algorithm", "ed25519", "-out", str(tmp_path / "s.pem")],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [openssl, "pkey", "-in", str(tmp_path / "s.pem"), "-pubout", "-out", str(tmp_path / "v.pem")],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        require_peer(False, f"openssl cannot make ed25519 keys here: {exc}")

    # THEN the files load and work together
    verify(b"x", sign(b"x", load_private_key(tmp_path / "s.pem")), load_public_key(tmp_path / "v.pem"))


def test_a_private_key_is_refused_where_the_public_key_belongs(keypair: tuple[bytes, bytes]) -> None:
    with pytest.raises(KeyFormatError, match="is a private key; agents verify with the public key only"):
        load_public_key(keypair[0])
    with pytest.raises(KeyFormatError, match="is a public key; signing needs the private key"):
        load_private_key(keypair[1])


def test_a_key_of_another_algorithm_is_refused() -> None:
    # GIVEN an RSA public key in PEM
    rsa_public = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(KeyFormatError, match="not an Ed25519 public key"):
        load_public_key(rsa_public)


@pytest.mark.parametrize(
    "source",
    ["", "hello", base64.b64encode(b"x" * 31).decode(), "/no/such/key.pem", "-----BEGIN PUBLIC KEY-----\nAAAA\n"],
)
def test_unusable_key_text_is_refused_with_the_accepted_forms(source: str) -> None:
    with pytest.raises(KeyFormatError, match="PEM"):
        load_public_key(source)


def test_an_unreadable_key_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(KeyFormatError, match="cannot read key file"):
        load_public_key(tmp_path / "missing.pem")


def test_without_cryptography_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN an interpreter where `import cryptography` fails
    monkeypatch.setitem(sys.modules, "cryptography", None)

    # THEN loading a key says what to install
    with pytest.raises(SigningUnavailableError, match="pip install cryptography"):
        load_public_key("AAAA")


def test_importing_the_command_modules_does_not_load_cryptography() -> None:
    # GIVEN a fresh interpreter that imports the agent's command handling and the signing module
    code = (
        "import sys, agent.commands, mbridge.approve, wire.signing; "
        "print(any(m == 'cryptography' or m.startswith('cryptography.') for m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)

    # THEN cryptography was not imported (an agent without a key never loads it)
    assert result.stdout.strip() == "False"
