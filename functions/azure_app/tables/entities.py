"""How values fit Table Storage entities: escaped and shortened keys, and values larger than one
property written in pieces (see the package docstring for the limits)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from functions.azure_app.tables.errors import TableValueTooLargeError

# An escaped key longer than this (in UTF-16 units) is shortened, leaving room under Table
# Storage's 1 KiB (512 units) for a partition's prefix such as "parked:".
_LONGEST_KEY = 480
_SHORTENED_KEY_PREFIX = 200  # characters: at most 400 units


def escape_key(value: str) -> str:
    """A Table Storage key for `value`: distinct values give distinct keys."""
    key = "".join(f"%{ord(c):02X}" if _needs_escape(c) else c for c in value)
    if utf16_units(key) <= _LONGEST_KEY:
        return key
    return f"{key[:_SHORTENED_KEY_PREFIX]}%~{hashlib.sha256(value.encode('utf-8', 'surrogatepass')).hexdigest()}"


def unescape_key(key: str) -> str:
    """The value `escape_key` made `key` of, when the key was not shortened (event keys and VM names
    never are: they are checked to fit a command before anything is stored under them)."""
    return _ESCAPED.sub(lambda match: chr(int(match.group(1), 16)), key)


_ESCAPED = re.compile(r"%([0-9A-F]{2})")


def utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _needs_escape(character: str) -> bool:
    code = ord(character)
    return character in "%/\\#?" or code < 0x20 or 0x7F <= code <= 0x9F


# One property holds 64 KiB of binary, or text of 32K UTF-16 units.
_PROPERTY_BYTES = 64 * 1024
# The pieces of one value; with its other properties the entity stays well under 1 MiB (Azurite
# counts binary as the base64 text of the request: 640 KiB is 853 KiB there).
_MOST_PIECES = 10


def text_properties(name: str, text: str) -> dict[str, Any]:
    """The properties that hold `text` under `name`: one string property when it fits (as every
    version before wrote it), else its UTF-8 bytes in pieces.

    Raises:
        TableValueTooLargeError: more than an entity can hold.
    """
    if 2 * utf16_units(text) <= _PROPERTY_BYTES:
        return {name: text, f"{name}_pieces": 1}
    return bytes_properties(name, text.encode("utf-8", "surrogatepass"))


def bytes_properties(name: str, data: bytes) -> dict[str, Any]:
    """The properties that hold `data` under `name`: `name`, `name_1`, ... and their count.

    Raises:
        TableValueTooLargeError: more than an entity can hold.
    """
    pieces = [data[start : start + _PROPERTY_BYTES] for start in range(0, len(data), _PROPERTY_BYTES)] or [b""]
    if len(pieces) > _MOST_PIECES:
        raise TableValueTooLargeError(
            f"{name} is {len(data)} bytes; an entity holds at most {_MOST_PIECES * _PROPERTY_BYTES} of it"
        )
    properties: dict[str, Any] = {_piece_name(name, index): piece for index, piece in enumerate(pieces)}
    properties[f"{name}_pieces"] = len(pieces)
    return properties


def text_of(entity: Mapping[str, Any], name: str) -> str:
    """What `text_properties` wrote (or a plain string property an earlier version wrote)."""
    value = entity[name]
    if isinstance(value, str):
        return value
    return bytes_of(entity, name).decode("utf-8", "surrogatepass")


def bytes_of(entity: Mapping[str, Any], name: str) -> bytes:
    """What `bytes_properties` wrote (or a single binary property an earlier version wrote)."""
    count = int(entity.get(f"{name}_pieces", 1))
    return b"".join(bytes(entity[_piece_name(name, index)]) for index in range(count))


def _piece_name(name: str, index: int) -> str:
    return name if index == 0 else f"{name}_{index}"


def fits_in_an_entity(text: str) -> bool:
    return len(text.encode("utf-8", "surrogatepass")) <= _MOST_PIECES * _PROPERTY_BYTES
