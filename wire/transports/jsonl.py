"""`jsonl`: one structured CloudEvent per line, appended to a file or written to stdout.

For piping into existing automation (`mbridge agent ... | your-tool`), and for looking
at exactly what the agent would publish. There is no command channel.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import IO

from wire.transports.base import CommandReceiver, OutboundMessage, TransportConfigError, TransportUnavailableError


class JsonlTransport:
    name = "jsonl"

    def __init__(self, path: str = "-") -> None:
        self._path = path
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None

    @property
    def commands(self) -> CommandReceiver | None:
        return None

    def publish(self, message: OutboundMessage) -> None:
        line = message.body.rstrip(b"\n") + b"\n"
        if b"\n" in line[:-1]:
            raise TransportConfigError("an envelope must be a single line of JSON")
        with self._lock:
            try:
                target = self._open()
                target.write(line)
                target.flush()
                if self._path != "-":
                    # "Published" means on disk: the outbox forgets the row after this returns.
                    os.fsync(target.fileno())
            except OSError as exc:
                self._file = None
                raise TransportUnavailableError(f"cannot append to {self._path}: {exc}") from exc

    def check(self) -> str:
        if self._path == "-":
            return "jsonl: writing to standard output"
        directory = Path(self._path).resolve().parent
        if not directory.is_dir() or not os.access(directory, os.W_OK):
            raise TransportConfigError(f"jsonl: cannot write into {directory}; choose another --jsonl-path")
        return f"jsonl: appending to {self._path}"

    def rest(self) -> None:
        """Nothing to let go: a file has no command path."""

    def close(self) -> None:
        with self._lock:
            if self._file is not None and self._path != "-":
                self._file.close()
            self._file = None

    def _open(self) -> IO[bytes]:
        if self._file is None:
            self._file = sys.stdout.buffer if self._path == "-" else open(self._path, "ab")  # noqa: SIM115
        return self._file
