"""What the local functions took, in the order they took it, as JSON lines that `mbridge replay`
reads (docs/contracts.md#replay-input).

One line per input, each with `received_at`, the functions' own clock when they took it: the moment
a message's proof was judged at and the clock of everything done for it. Nothing else can stand in
for it: an envelope's own `time` is what its sender wrote (a forger writes what suits it), and a
proof that was fresh then may have expired since.

    {"received_at": T, "envelope": {...}}   a message of the bus, as it came (its JSON object; the
                                             text when it was not one)
    {"received_at": T, "central": {...}}    one VM's part of a control-plane report, as the feed's
                                             adapter made it (`CentralReport.to_bytes`)
    {"received_at": T, "sweep": true}       the timer's sweep for silent agents

The local host and the central feed reader run in threads of their own: a recorder takes lines from
both, each written whole, in the order they were taken.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Union

from functions.core.central import CentralReport
from wire.timefmt import parse_rfc3339

RECEIVED_AT = "received_at"


class Recorder:
    """Appends the functions' inputs to a JSON lines file, flushed line by line (a run that dies
    leaves everything it took so far)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())

    def envelope(self, body: bytes, at: datetime) -> None:
        self._write(at, "envelope", _body(body))

    def central(self, report: CentralReport, at: datetime) -> None:
        # One line per VM, as the core acts on it (`process_central` takes the VMs one by one).
        for vm in report.vms:
            self._write(at, "central", json.loads(report.to_bytes(vm)))

    def sweep(self, at: datetime) -> None:
        self._write(at, "sweep", True)

    def _write(self, at: datetime, what: str, value: Any) -> None:
        # ASCII only: a lone surrogate escape in a body stays an escape, as it came.
        line = json.dumps({RECEIVED_AT: format_received(at), what: value})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def format_received(at: datetime) -> str:
    """RFC 3339 in UTC to the microsecond: a silent agent's wait is measured between two of these."""
    return at.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _body(body: bytes) -> Any:
    """A message body as the line carries it: its JSON object, readable as it is; anything else (which the
    functions audited as malformed) as its text."""
    try:
        document = json.loads(body)
    except ValueError:
        return body.decode("utf-8", errors="replace")
    return document if isinstance(document, dict) else body.decode("utf-8")


@dataclass(frozen=True)
class Received:
    """A message of the bus, and when the functions took it."""

    at: datetime
    body: bytes


@dataclass(frozen=True)
class CentralReceived:
    at: datetime
    report: CentralReport


@dataclass(frozen=True)
class Sweep:
    at: datetime


RecordedInput = Union[Received, CentralReceived, Sweep]


class NotRecordedError(ValueError):
    """A line with `received_at` that is not one of the recorded inputs; the message says why."""


def recorded(document: Any) -> RecordedInput | None:
    """The recorded input a parsed line is, or None when it is no record (a bare envelope, say).

    Raises:
        NotRecordedError: it has `received_at` but is not a well-formed record.
    """
    if not isinstance(document, dict) or RECEIVED_AT not in document:
        return None
    try:
        at = parse_rfc3339(str(document[RECEIVED_AT]))
    except ValueError as exc:
        raise NotRecordedError(f"{RECEIVED_AT}: {exc}") from None
    kinds = [key for key in ("envelope", "central", "sweep") if key in document]
    if len(kinds) != 1:
        raise NotRecordedError(f"a record holds one of envelope, central or sweep beside {RECEIVED_AT}")
    value = document[kinds[0]]
    if kinds[0] == "envelope":
        text = value if isinstance(value, str) else json.dumps(value)
        return Received(at, text.encode("utf-8", errors="replace"))
    if kinds[0] == "central":
        try:
            return CentralReceived(at, CentralReport.from_bytes(json.dumps(value).encode("utf-8")))
        except (KeyError, TypeError, ValueError) as exc:
            raise NotRecordedError(f"central: not a control-plane report: {exc!r}") from None
    return Sweep(at)
