"""Ed25519 signatures of commands (docs/contracts.md#signing): the functions sign, the agents verify.

A signature covers the canonical bytes of a command (wire/commands.py): the JSON
object without `signature`, keys sorted, separators `,` and `:`, UTF-8. It travels as base64url
without padding; padded text is accepted on input.

`cryptography` is imported inside the functions, never at module import: an agent without a
configured key never loads it.

Keys load from:
- PEM: SubjectPublicKeyInfo (`-----BEGIN PUBLIC KEY-----`) or unencrypted PKCS#8
  (`-----BEGIN PRIVATE KEY-----`), as `openssl genpkey -algorithm ed25519` writes them;
- the raw 32-byte key as base64 or base64url text (padded or not);
- a path to a file holding either.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Union

from wire.commands import Command
from wire.errors import PermanentError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

KeySource = Union[str, bytes, "os.PathLike[str]"]

RAW_KEY_LENGTH = 32
SIGNATURE_LENGTH = 64
_PEM_MARKER = b"-----BEGIN "
_BASE64_TEXT = re.compile(r"^[A-Za-z0-9+/_-]+={0,2}$")
_BASE64URL_TEXT = re.compile(r"^[A-Za-z0-9_-]+={0,2}$")


class SigningUnavailableError(PermanentError):
    """The `cryptography` package is not installed."""


class KeyFormatError(PermanentError):
    """A key that is not an Ed25519 key in one of the accepted forms."""


class BadSignatureError(PermanentError):
    """A signature that does not decode, or does not match the command under the configured key."""


def generate_keypair() -> tuple[bytes, bytes]:
    """A new Ed25519 key pair as (private PKCS#8 PEM, public SubjectPublicKeyInfo PEM)."""
    _require_cryptography()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    private = ed25519.Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private_pem, public_pem


def load_private_key(source: KeySource) -> Ed25519PrivateKey:
    """Load the functions' (or an operator's) signing key.

    Raises:
        KeyFormatError: not an Ed25519 private key in an accepted form; the message lists them.
        SigningUnavailableError: `cryptography` is not installed.
    """
    _require_cryptography()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    material, origin = _material(source)
    if _PEM_MARKER in material:
        if b"PUBLIC KEY" in material:
            raise KeyFormatError(f"{origin} is a public key; signing needs the private key (PKCS#8 PEM)")
        try:
            key = serialization.load_pem_private_key(material, password=None)
        except (ValueError, TypeError) as exc:
            raise KeyFormatError(
                f"{origin} is not an unencrypted PKCS#8 PEM private key ({exc}); "
                "write one with `openssl genpkey -algorithm ed25519 -out signing.pem`"
            ) from exc
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise KeyFormatError(f"{origin} holds a {type(key).__name__}, not an Ed25519 private key")
        return key
    try:
        return ed25519.Ed25519PrivateKey.from_private_bytes(_raw_key(material, origin))
    except ValueError as exc:
        raise KeyFormatError(f"{origin} is not a usable Ed25519 private key: {exc}") from exc


def load_public_key(source: KeySource) -> Ed25519PublicKey:
    """Load the agents' verification key.

    Raises:
        KeyFormatError: not an Ed25519 public key in an accepted form; the message lists them.
        SigningUnavailableError: `cryptography` is not installed.
    """
    _require_cryptography()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    material, origin = _material(source)
    if _PEM_MARKER in material:
        if b"PRIVATE KEY" in material:
            raise KeyFormatError(
                f"{origin} is a private key; agents verify with the public key only: "
                "`openssl pkey -in signing.pem -pubout -out verify.pem`"
            )
        try:
            key = serialization.load_pem_public_key(material)
        except (ValueError, TypeError) as exc:
            raise KeyFormatError(
                f"{origin} is not a PEM public key (SubjectPublicKeyInfo) ({exc}); "
                "derive one with `openssl pkey -in signing.pem -pubout -out verify.pem`"
            ) from exc
        if not isinstance(key, ed25519.Ed25519PublicKey):
            raise KeyFormatError(f"{origin} holds a {type(key).__name__}, not an Ed25519 public key")
        return key
    try:
        return ed25519.Ed25519PublicKey.from_public_bytes(_raw_key(material, origin))
    except ValueError as exc:
        raise KeyFormatError(f"{origin} is not a usable Ed25519 public key: {exc}") from exc


def sign(canonical: bytes, private_key: Ed25519PrivateKey) -> str:
    """The base64url signature (no padding) of canonical command bytes."""
    return _b64url(private_key.sign(canonical))


def sign_command(command: Command, private_key: Ed25519PrivateKey) -> Command:
    """The same command with its `signature` set over its canonical bytes."""
    return command.with_signature(sign(command.signing_bytes(), private_key))


def verify(canonical: bytes, signature: str, public_key: Ed25519PublicKey) -> None:
    """Check a base64url signature (padded or not) over canonical command bytes.

    Raises:
        BadSignatureError: the text is not base64url of 64 bytes, or it does not match.
    """
    _require_cryptography()
    from cryptography.exceptions import InvalidSignature

    raw = _b64url_decode(signature)
    if raw is None or len(raw) != SIGNATURE_LENGTH:
        raise BadSignatureError("the signature is not base64url text of a 64-byte Ed25519 signature")
    try:
        public_key.verify(raw, canonical)
    except InvalidSignature:
        raise BadSignatureError(
            "the signature does not match the command under the configured verification key "
            "(the command was altered, or signed with another key)"
        ) from None


def public_key_text(public_key: Ed25519PublicKey) -> str:
    """The raw 32-byte public key as base64url text: a one-line form for settings and flags."""
    _require_cryptography()
    from cryptography.hazmat.primitives import serialization

    return _b64url(public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def _require_cryptography() -> None:
    try:
        import cryptography  # noqa: F401
    except ImportError as exc:
        raise SigningUnavailableError(
            "signed commands need the cryptography package: pip install cryptography (version 41 or later)"
        ) from exc


def _material(source: KeySource) -> tuple[bytes, str]:
    """The key bytes and a description of where they came from (for error messages)."""
    if isinstance(source, os.PathLike):
        return _read(Path(source)), f"key file {os.fspath(source)}"
    text = source if isinstance(source, bytes) else source.encode("utf-8")
    stripped = text.strip()
    if _PEM_MARKER in stripped or _raw_key_or_none(stripped) is not None:
        return stripped, "the key text"
    path = Path(text.decode("utf-8", errors="replace").strip())
    if stripped and path.is_file():
        return _read(path), f"key file {path}"
    raise KeyFormatError(
        "the key is neither PEM, nor a raw 32-byte Ed25519 key as base64/base64url, nor the path of a file "
        "holding either; generate a pair with `openssl genpkey -algorithm ed25519` (see docs/commands.md)"
    )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes().strip()
    except OSError as exc:
        raise KeyFormatError(f"cannot read key file {path}: {exc.strerror or exc}") from exc


def _raw_key(material: bytes, origin: str) -> bytes:
    raw = _raw_key_or_none(material)
    if raw is None:
        raise KeyFormatError(
            f"{origin} is neither PEM nor a raw 32-byte Ed25519 key as base64/base64url text; "
            "see docs/commands.md for the accepted key forms"
        )
    return raw


def _raw_key_or_none(material: bytes) -> bytes | None:
    try:
        text = material.decode("ascii")
    except UnicodeDecodeError:
        return None
    if not _BASE64_TEXT.match(text):
        return None
    normalized = text.rstrip("=").replace("+", "-").replace("/", "_")
    raw = _b64url_decode(normalized)
    return raw if raw is not None and len(raw) == RAW_KEY_LENGTH else None


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _b64url_decode(text: str) -> bytes | None:
    if not _BASE64URL_TEXT.match(text):
        return None
    unpadded = text.rstrip("=")
    try:
        return base64.urlsafe_b64decode(unpadded + "=" * (-len(unpadded) % 4))
    except (binascii.Error, ValueError):
        return None
