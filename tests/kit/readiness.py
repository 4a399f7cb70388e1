"""The one fake of the agent's readiness (what /readyz answers)."""

from __future__ import annotations


class RecordingReadiness:
    def __init__(self) -> None:
        self.calls: list[tuple[bool, str]] = []  # (drained, reason) of every change, in order

    def set_drained(self, drained: bool, reason: str) -> None:
        self.calls.append((drained, reason))
