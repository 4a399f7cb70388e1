"""JSON text from outside the process, parsed so that every way it can be wrong is a ValueError.

`json.loads` alone lets two inputs through that later code cannot handle: nesting deeper than the
interpreter's recursion limit raises RecursionError, and a lone UTF-16 surrogate escape ("\\ud800")
becomes a str that no `.encode("utf-8")` accepts (ids are hashed, commands are signed over UTF-8
bytes). Both are refused here, with a message that says what is wrong, so every parser keeps to its
one documented error.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Union

# A \uD800-\uDFFF escape: the only way JSON text in valid UTF-8 can produce a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

JsonText = Union[bytes, bytearray, str]

_NESTING_MESSAGE = "the JSON is nested too deeply to be a document of this kind"
_SURROGATE_MESSAGE = "a string holds a lone UTF-16 surrogate (such as \\ud800): not valid Unicode text"


def load_json(body: JsonText, *, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """Parse JSON text (UTF-8 bytes or str).

    Raises:
        ValueError: not UTF-8, not JSON, nested too deeply, or a string holds a lone surrogate.
    """
    if isinstance(body, str):
        text = body
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(_SURROGATE_MESSAGE) from None
    else:
        text = bytes(body).decode("utf-8")
    try:
        document = json.loads(text, object_pairs_hook=object_pairs_hook)
    except RecursionError:
        raise ValueError(_NESTING_MESSAGE) from None
    if _SURROGATE_ESCAPE.search(text):
        require_unicode(document)
    return document


def require_unicode(document: Any) -> None:
    """Refuse a parsed document (or a Mapping handed over already parsed) whose strings are not valid
    Unicode text.

    Raises:
        ValueError: a key or string value holds a lone UTF-16 surrogate.
    """
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(_SURROGATE_MESSAGE) from None
    except RecursionError:
        raise ValueError(_NESTING_MESSAGE) from None
