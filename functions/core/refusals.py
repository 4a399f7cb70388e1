"""Refused reports, counted for one summary notice per interval instead of a notice each.

An unverified, not-self or malformed record is a report nobody can vouch for: anyone who can
publish to the bus can make a thousand of them a second, each saying what its author likes. Each
announced on its own, they would fill the channel, and the webhook's queue, where they would push
out the notices of genuine drains and approvals. So `RefusalDigest` only counts them, by kind, and
keeps the first few as samples; `take_due` hands the lot over as one `RefusalSummary` when the
previous summary is at least an interval old. The first refusal after a quiet interval is thus
summarised at once (people learn at once that something is refused), and those that follow wait
for the interval's end, however many they are. Whatever the flood, what is held is a few counters
and `SAMPLES` records.

Pure but for a lock (`append` runs on the invocations' threads, a wake-up on a timer thread); the
clock is given (tests move it by hand). Python 3.9: functions/core runs on the VM images' python.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from functions.core.ports import AuditKind, AuditRecord
from wire.timefmt import format_rfc3339

# The kinds of records nobody vouches for, in the order a summary counts them.
REFUSED_KINDS: tuple[str, ...] = (AuditKind.UNVERIFIED.value, AuditKind.NOT_SELF.value, AuditKind.MALFORMED.value)
# At most one summary per this many seconds, unless the settings say otherwise
# (MBRIDGE_WEBHOOK_SUMMARY_SECONDS): short enough that people hear of a flood within the minute.
DEFAULT_SUMMARY_SECONDS = 60.0
# Samples quoted in a summary, and how much of each sender-chosen text: enough to tell a
# misconfigured VM (one name, one reason) from a flood (many names), and no more of the attacker's text.
SAMPLES = 3
SAMPLE_VM_CHARS = 40
SAMPLE_REASON_CHARS = 80


def is_refusal(record: AuditRecord) -> bool:
    """Whether the record is of a report nobody can vouch for."""
    return record.kind in REFUSED_KINDS


@dataclass(frozen=True)
class RefusalSummary:
    """The refusals since the previous summary: how many of each kind, the first few, and when."""

    counts: Mapping[str, int]  # by kind, in REFUSED_KINDS order, kinds with none left out
    samples: tuple[AuditRecord, ...]
    first: datetime
    last: datetime

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def tally(self) -> str:
        """`998 unverified, 1 not-self, 1 malformed`."""
        return ", ".join(f"{count} {kind}" for kind, count in self.counts.items())

    def text(self) -> str:
        """One line for a chat channel. Raw: the caller neutralises its markup (chat_markup)."""
        total, shown = self.total, len(self.samples)
        plural = "" if total == 1 else "s"
        first = "the first" if shown == 1 else f"the first {shown}"
        samples = "; ".join(_sample(record) for record in self.samples)
        return (
            f"[maintenance-bridge] {total} refused report{plural} since {format_rfc3339(self.first)} "
            f"({self.tally()}), nothing done for them; {first}: {samples}"
        )


def _sample(record: AuditRecord) -> str:
    reason = _cut(record.reason, SAMPLE_REASON_CHARS)
    if record.kind == AuditKind.MALFORMED:
        # No sender to name: the digest of the message is its only id.
        return f"malformed message {record.envelope_id[:16]} ({reason})"
    return f"{record.kind!s} from '{_cut(record.vm, SAMPLE_VM_CHARS)}' ({reason})"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class RefusalDigest:
    """Counts refused records between summaries; at most one summary per `interval` seconds."""

    def __init__(self, interval: float, monotonic: Callable[[], float]) -> None:
        if interval <= 0:
            raise ValueError(f"the summary interval is a number of seconds above 0, not {interval}")
        self.interval = interval
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._samples: list[AuditRecord] = []
        self._first: datetime | None = None
        self._last: datetime | None = None
        self._summarised_at: float | None = None  # none yet: the first is due at once

    def add(self, record: AuditRecord) -> None:
        with self._lock:
            kind = str(record.kind)
            self._counts[kind] = self._counts.get(kind, 0) + 1
            if len(self._samples) < SAMPLES:
                self._samples.append(record)
            self._first = self._first or record.time
            self._last = record.time

    def take_due(self) -> RefusalSummary | None:
        """The refusals held, once the previous summary is an interval old (then held no more); else None."""
        with self._lock:
            if self._first is None or self._last is None or self._wait() > 0:
                return None
            counts = {kind: self._counts[kind] for kind in REFUSED_KINDS if kind in self._counts}
            summary = RefusalSummary(counts, tuple(self._samples), self._first, self._last)
            self._counts, self._samples, self._first, self._last = {}, [], None, None
            self._summarised_at = self._monotonic()
            return summary

    def seconds_until_due(self) -> float | None:
        """How long until the refusals held may be summarised (0: now); None when none is held."""
        with self._lock:
            return None if self._first is None else self._wait()

    def _wait(self) -> float:
        if self._summarised_at is None:
            return 0.0
        return max(0.0, self._summarised_at + self.interval - self._monotonic())
