"""The token before its signature is checked: its size, its one canonical spelling, and the header's
algorithm and key id (which picks the certificate).

google-auth reads the parts; this module bounds and constrains what it is given.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any, Callable

from google.auth import jwt

from functions.trust.gce_token.errors import TokenError

ALGORITHM = "RS256"
MAX_TOKEN_BYTES = 16 * 1024  # tokens are about 1 KiB; anything this large is not one
_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")

# google-auth's functions carry no annotations; these names give them the types they document.
decode: Callable[..., Mapping[str, Any]] = jwt.decode
_decode_header: Callable[[str], Mapping[str, Any]] = jwt.decode_header


def check_size(token: object) -> None:
    if not isinstance(token, str):
        raise TokenError(f"the identity token must be text, got {type(token).__name__}")
    if not token:
        raise TokenError("the identity token is empty: check that the sender requests one from the metadata server")
    size = len(token.encode("utf-8", "surrogatepass"))
    if size > MAX_TOKEN_BYTES:
        raise TokenError(
            f"the identity token is {size} bytes, over the {MAX_TOKEN_BYTES // 1024} KiB limit: GCE identity tokens "
            "are about 1 KiB, so this is not one; check what the sender attached"
        )


def _check_encoding(token: str) -> None:
    """Three parts of canonical unpadded base64url, so that a token has exactly one spelling.

    google-auth decodes leniently: the unused low bits of a part's last character can change without
    changing the bytes, so a signed token could be re-spelled and still verify, slipping past a
    replay check keyed on the token's text. This only compares each part with its re-encoding;
    reading the parts stays google-auth's.
    """
    parts = token.split(".")
    if len(parts) != 3 or not all(_SEGMENT.fullmatch(part) for part in parts):
        raise TokenError("the identity token is not a JWT: three base64url parts separated by dots")
    for part in parts:
        try:
            raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        except (binascii.Error, ValueError) as exc:
            raise TokenError(f"the identity token is not a JWT: a part is not base64url ({exc})") from exc
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != part:
            raise TokenError("the identity token is not canonical base64url: it was altered after signing")


def key_id(token: str) -> str:
    """The header's key id, after checking the encoding and the algorithm (google-auth reads the header)."""
    _check_encoding(token)
    try:
        header = _decode_header(token)
    except Exception as exc:  # untrusted input: any failure to read it is a refusal
        raise TokenError(
            f"the identity token is not a JWT (three base64url parts, the first a JSON header): {exc}"
        ) from exc
    if not isinstance(header, Mapping):
        raise TokenError("the token's header is not a JSON object")
    algorithm = header.get("alg")
    if algorithm != ALGORITHM:
        raise TokenError(f"the token is signed with {algorithm!r}, not {ALGORITHM} as GCE identity tokens are")
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise TokenError("the token's header names no key id (kid), which GCE identity tokens always do")
    return kid
