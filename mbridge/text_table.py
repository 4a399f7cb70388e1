"""Plain text tables for people (`mbridge fleet`, `mbridge audit list`): columns aligned, every value
shown safely, standard library only.

A value comes from the audit log, which holds what VMs and messages said: it may carry what a
terminal would act on (escapes, control characters) or could not show, so each cell is escaped
(`cell`) and measured in terminal columns (`width`), not in characters.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence


def aligned(rows: Sequence[Sequence[str]]) -> str:
    """Rows of cells, the header first, as lines: each column as wide as its widest cell, two spaces
    between columns, nothing after the last value of a line."""
    widths = [max(width(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = []
    for row in rows:
        padded = [text + " " * (widths[column] - width(text)) for column, text in enumerate(row)]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines) + "\n"


def cell(value: str, most: int) -> str:
    """A value as one cell of the table: what a terminal would act on or could not show (control
    characters, escapes, bidirectional overrides, combining marks) as escapes, and cut with "…" to at
    most `most` columns."""
    shown = "".join(_escaped(char) for char in value)
    if width(shown) <= most:
        return shown
    kept, used = [], 0
    for char in shown:
        used += width(char)
        if used > most - 1:
            break
        kept.append(char)
    return "".join(kept) + "…"


def _escaped(char: str) -> str:
    if char.isprintable() and not unicodedata.combining(char) and char != "\\":
        return char
    if char == "\\":
        return "\\\\"
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def width(text: str) -> int:
    """The columns `text` takes on a terminal: two for a wide (East Asian) character."""
    return sum(2 if unicodedata.east_asian_width(char) in ("W", "F") else 1 for char in text)


def short_id(event_id: str, keep: int = 8) -> str:
    """An event id cut to its first `keep` characters and "…" (an Azure GUID's first group)."""
    return event_id if len(event_id) <= keep + 1 else event_id[:keep] + "…"
