"""The command signing key as the Terraform makes it, and as the functions and the agents load it.

GIVEN an Ed25519 key pair written the way the tls provider writes it: the private key as
      unencrypted PKCS#8 PEM (x509.MarshalPKCS8PrivateKey, block "PRIVATE KEY", for both
      private_key_pem and private_key_pem_pkcs8), the public key as SubjectPublicKeyInfo PEM
      (x509.MarshalPKIXPublicKey, block "PUBLIC KEY"), both through Go's pem.EncodeToMemory (base64
      lines of 64 characters, a final newline)
WHEN  wire/signing.py loads the PEM (what the GCP secret holds), and the expressions of
      signing.tf (both clouds) turn it into one-line settings, evaluated here in Python and, when a
      terraform binary is at hand, by `terraform console` itself
THEN  the function's key and the agents' key are one pair: what one signs, the other verifies.
"""

from __future__ import annotations

import base64
import json
import os
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tests.infra import console as terraform_console
from tests.infra.sources import TERRAFORM_AZURE, TERRAFORM_GCP, load_terraform
from wire.signing import load_private_key, load_public_key, public_key_text, sign, verify

# The DER framing of an Ed25519 key: PKCS#8 v1 (version 0, OID 1.3.101.112, the 32-byte key in an
# OCTET STRING in an OCTET STRING), and SubjectPublicKeyInfo (OID 1.3.101.112, a 32-byte BIT STRING).
PKCS8_PREFIX = bytes.fromhex("302e020100300506032b657004220420")
SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")

SEEDS = [
    os.urandom(32),
    os.urandom(32),
    b"\r\n" * 16,  # CR LF is one character to Terraform's substr (a grapheme cluster)
    bytes(range(0x80, 0xA0)),  # C1 controls
    bytes(32),
    bytes(range(0xE0, 0x100)),
]
IDS = ["random-1", "random-2", "crlf", "c1-controls", "zeros", "latin-1-letters"]


def pem(kind: str, der: bytes) -> str:
    """What Go's pem.EncodeToMemory writes: base64 in lines of 64 characters, a final newline."""
    body = base64.b64encode(der).decode("ascii")
    lines = "\n".join(body[start : start + 64] for start in range(0, len(body), 64))
    return f"-----BEGIN {kind}-----\n{lines}\n-----END {kind}-----\n"


def tls_keys(seed: bytes) -> tuple[str, str, bytes]:
    """(private_key_pem_pkcs8, public_key_pem, raw public key) of the pair tls would write for `seed`."""
    raw_public = ed25519.Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
    return pem("PRIVATE KEY", PKCS8_PREFIX + seed), pem("PUBLIC KEY", SPKI_PREFIX + raw_public), raw_public


def assert_one_pair(private_source: str, public_source: str, raw_public: bytes) -> None:
    private_key, public_key = load_private_key(private_source), load_public_key(public_source)
    assert public_key.public_bytes_raw() == raw_public
    assert private_key.public_key().public_bytes_raw() == raw_public
    canonical = b'{"command_id":"c1","target":"web-0","type":"approve"}'
    verify(canonical, sign(canonical, private_key), public_key)


@pytest.mark.parametrize("seed", SEEDS, ids=IDS)
def test_the_framing_is_the_one_cryptography_writes_too(seed: bytes) -> None:
    # GIVEN the same key serialised by cryptography; THEN the bytes are the ones built above, so the
    # tests below hold for keys of either origin
    key = ed25519.Ed25519PrivateKey.from_private_bytes(seed)
    private_pem, public_pem, _ = tls_keys(seed)
    written = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    assert written.decode() == private_pem
    assert (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
        == public_pem
    )


@pytest.mark.parametrize("seed", SEEDS, ids=IDS)
def test_the_pem_keys_as_tls_writes_them_are_one_pair(seed: bytes) -> None:
    # GIVEN the private key as the GCP secret holds it, and the public key PEM
    private_pem, public_pem, raw_public = tls_keys(seed)
    # THEN signing.py loads both as they are, and they verify each other
    assert_one_pair(private_pem, public_pem, raw_public)


# ---------------------------------------------------------------- the expressions of signing.tf


def signing_locals(directory: Path) -> dict[str, str]:
    """The locals of a module's signing.tf, as expression source text (without `${ }`)."""
    parsed = load_terraform(directory)
    defined = {name: value for block in parsed.get("locals", []) for name, value in block.items()}
    names = set(re.findall(r"^\s*(\w+)\s*=", (directory / "signing.tf").read_text(encoding="utf-8"), re.M))
    found = {}
    for name in names & defined.keys():
        whole = re.fullmatch(r"\$\{(.*)\}", str(defined[name]), re.DOTALL)
        if whole:
            found[name] = whole.group(1)
    return found


def hcl_string(literal: str) -> str:
    """The value of an HCL string literal's text (escapes as in JSON for what signing.tf uses)."""
    value: str = json.loads(f'"{literal}"')
    return value


def terraform_regex(pattern: str, text: str) -> str:
    """Terraform's regex(pattern, text)[0]: the first group of the first match (RE2; the patterns
    here mean the same in Python)."""
    found = re.search(pattern, text)
    assert found, f"no match of {pattern!r}: terraform would fail the plan"
    return found.group(1)


def iso_8859_1(text: str) -> str:
    """A Terraform string: NFC-normalised, as every string value is (latin-1 text is left as is)."""
    return unicodedata.normalize("NFC", text)


_REGEX_CALL = r'regex\("((?:[^"\\]|\\.)*)", {argument}\)\[0\]'


def python_verify_key(expression: str, public_pem: str) -> str:
    """local.verify_key: `regex("<pattern>", <tls key>.public_key_pem)[0]`."""
    call = re.search(_REGEX_CALL.format(argument=r"tls_private_key\.commands(?:\[0\])?\.public_key_pem"), expression)
    assert call, expression
    return terraform_regex(hcl_string(call.group(1)), public_pem)


def python_signing_key(der_expression: str, key_expression: str, private_pem: str) -> str:
    """local.signing_key_der and local.signing_key of the Azure module."""
    decode = re.fullmatch(
        r"textdecodebase64\("
        + _REGEX_CALL.format(argument=r"tls_private_key\.commands\.private_key_pem_pkcs8")
        + r', "ISO-8859-1"\)',
        der_expression.replace("\n", " ").strip(),
    )
    assert decode, der_expression
    der = iso_8859_1(base64.b64decode(terraform_regex(hcl_string(decode.group(1)), private_pem)).decode("latin-1"))
    encode = re.fullmatch(
        r"textencodebase64\(" + _REGEX_CALL.format(argument=r"local\.signing_key_der") + r', "ISO-8859-1"\)',
        key_expression.strip(),
    )
    assert encode, key_expression
    return base64.b64encode(terraform_regex(hcl_string(encode.group(1)), der).encode("latin-1")).decode("ascii")


@pytest.mark.parametrize("seed", SEEDS, ids=IDS)
def test_the_azure_settings_are_one_line_keys_of_one_pair(seed: bytes) -> None:
    # GIVEN the Azure module's expressions and a key pair as tls writes it
    expressions = signing_locals(TERRAFORM_AZURE)
    private_pem, public_pem, raw_public = tls_keys(seed)
    # WHEN they make MBRIDGE_SIGNING_KEY (an app setting) and MBRIDGE_VERIFY_KEY (agent.env)
    signing_key = python_signing_key(expressions["signing_key_der"], expressions["signing_key"], private_pem)
    verify_key = python_verify_key(expressions["verify_key"], public_pem)
    # THEN both are one line of base64 of the raw key, and one pair
    assert re.fullmatch(r"[A-Za-z0-9+/]{43}=", signing_key)
    assert re.fullmatch(r"[A-Za-z0-9+/]{43}=", verify_key)
    assert base64.b64decode(signing_key) == seed
    assert_one_pair(signing_key, verify_key, raw_public)
    # AND the agent's key is the one-line form signing.py itself prints for it
    assert public_key_text(load_public_key(verify_key)) == public_key_text(load_public_key(public_pem))


@pytest.mark.parametrize("seed", SEEDS, ids=IDS)
def test_the_gcp_agents_get_the_public_key_of_the_secret(seed: bytes) -> None:
    # GIVEN the GCP module's expression and a generated pair: the secret holds the PEM itself
    expressions = signing_locals(TERRAFORM_GCP)
    private_pem, public_pem, raw_public = tls_keys(seed)
    # WHEN the agents' MBRIDGE_VERIFY_KEY is made; THEN it verifies what the secret's key signs
    verify_key = python_verify_key(expressions["verify_key"], public_pem)
    assert re.fullmatch(r"[A-Za-z0-9+/]{43}=", verify_key)
    assert_one_pair(private_pem, verify_key, raw_public)


def test_a_key_of_another_algorithm_fails_the_plan() -> None:
    # GIVEN an RSA public key where the Ed25519 one is expected; THEN the regex finds nothing, and
    # Terraform's regex() fails the plan instead of writing a wrong key to every VM
    expressions = signing_locals(TERRAFORM_AZURE)
    rsa_like = pem("PUBLIC KEY", bytes.fromhex("30820122300d06092a864886f70d01010105000382010f00") + bytes(270))
    with pytest.raises(AssertionError, match="terraform would fail the plan"):
        python_verify_key(expressions["verify_key"], rsa_like)


# ---------------------------------------------------------------- the same, by terraform itself


def console_module(directory: Path, names: tuple[str, ...], tmp_path: Path) -> Path:
    """A module of variables standing for tls_private_key's attributes and the given locals of
    signing.tf, which `terraform console` evaluates without any provider."""
    expressions = signing_locals(directory)
    lines = [
        'variable "public_key_pem" { type = string }',
        'variable "private_key_pem_pkcs8" { type = string }',
        'variable "verify_key" {\n  type    = string\n  default = ""\n}',
        "locals {",
        "  generate_signing_key = true",
    ]
    for name in names:
        expression = re.sub(r"tls_private_key\.commands(?:\[0\])?\.", "var.", expressions[name])
        lines.append(f"  {name} = {expression}")
    lines.append("}")
    module = tmp_path / directory.name
    module.mkdir()
    (module / "main.tf").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return module


def console(module: Path, private_pem: str, public_pem: str, expression: str) -> Any:
    variables = {"private_key_pem_pkcs8": private_pem, "public_key_pem": public_pem}
    return terraform_console.evaluate(module, expression, variables, timeout=60)


@terraform_console.needs_terraform
@pytest.mark.parametrize("seed", SEEDS, ids=IDS)
def test_terraform_makes_the_same_one_line_keys(seed: bytes, tmp_path: Path) -> None:
    # GIVEN signing.tf's expressions of both modules, evaluated by terraform on a pair tls would write
    private_pem, public_pem, raw_public = tls_keys(seed)
    azure = console_module(TERRAFORM_AZURE, ("verify_key", "signing_key_der", "signing_key"), tmp_path)
    gcp = console_module(TERRAFORM_GCP, ("verify_key",), tmp_path)
    signing_key, verify_key = console(azure, private_pem, public_pem, "[local.signing_key, local.verify_key]")
    gcp_verify_key = console(gcp, private_pem, public_pem, "local.verify_key")
    # THEN they are what the Python evaluation above gives, and one pair
    assert isinstance(signing_key, str)
    assert isinstance(verify_key, str)
    assert base64.b64decode(signing_key) == seed
    assert gcp_verify_key == verify_key == base64.b64encode(raw_public).decode("ascii")
    assert_one_pair(signing_key, verify_key, raw_public)
    assert_one_pair(private_pem, verify_key, raw_public)
