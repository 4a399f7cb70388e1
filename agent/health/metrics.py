"""The agent's metrics registry: counters, gauges and histograms, rendered in the Prometheus text
format when /metrics is scraped.

Kept apart from the server: every part of the agent records into it, only the server reads it.
Names follow the Prometheus conventions: base units in the name (`_seconds`, `_bytes`), `_total`
for counters, `_info` for a constant 1 whose labels carry the information (docs/operations.md#metrics).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Callable

LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# Every kind `mbridge_errors_total` counts. Each has a series at 0 from the start: an alert on
# `increase(mbridge_errors_total[5m]) > 0` (or rate()) cannot see the first error of a series
# that did not exist before it.
ERROR_KINDS = (
    # reading the metadata service (agent.sources.http.MetadataUnavailableError.kind)
    "rate_limited",
    "server_error",
    "client_error",
    "timeout",
    "connection",
    "redirect",
    "malformed",
    # the agent's own work (agent.loop)
    "state",
    "publish",
    "publish_config",
    "identity_proof",
    "commands",
    "command_retry",
    "command_crash",
    "crash",
)

# A labelled gauge is read as (labels, value) pairs when /metrics is scraped.
Series = Iterable[tuple[Mapping[str, str], float]]


class Histogram:
    def __init__(self, buckets: Sequence[float] = LAG_BUCKETS) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += 1
        self.total += value
        self.count += 1


class Metrics:
    """The agent's counters, gauges and histograms. Thread-safe; rendered on demand."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._histograms: dict[str, Histogram] = {}
        self._gauges: dict[str, Callable[[], float | None]] = {}
        self._families: dict[str, Callable[[], Series]] = {}
        self._help: dict[str, tuple[str, str]] = {}

    def describe(self, name: str, kind: str, text: str) -> None:
        self._help[name] = (kind, text)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + amount

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            self._histograms.setdefault(name, Histogram()).observe(value)

    def gauge(self, name: str, read: Callable[[], float | None]) -> None:
        """A value read when /metrics is scraped (None: not known yet, not exported)."""
        self._gauges[name] = read

    def gauges(self, name: str, read: Callable[[], Series]) -> None:
        """A gauge with labels, read when /metrics is scraped: one series per (labels, value)
        pair; a series not read any more is gone from the next scrape."""
        self._families[name] = read

    def info(self, name: str, **labels: str) -> None:
        """A constant 1 whose labels tell something about this process (`*_info`)."""
        fixed = ((dict(labels), 1.0),)
        self._families[name] = lambda: fixed

    def value(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._counters.get((name, tuple(sorted(labels.items()))), 0.0)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            counters = dict(self._counters)
            histograms = {name: (h.buckets, list(h.counts), h.total, h.count) for name, h in self._histograms.items()}
        families = dict(self._families)
        names = sorted(
            {name for name, _ in counters} | set(histograms) | set(self._gauges) | set(families) | set(self._help)
        )
        for name in names:
            kind, text = self._help.get(name, ("untyped", name))
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            for (metric, labels), amount in sorted(counters.items()):
                if metric == name:
                    lines.append(f"{name}{_labels(labels)} {_number(amount)}")
            if name in histograms:
                buckets, counts, total, count = histograms[name]
                for bound, amount in zip(buckets, counts):
                    lines.append(f'{name}_bucket{{le="{_number(bound)}"}} {amount}')
                lines.append(f'{name}_bucket{{le="+Inf"}} {count}')
                lines.append(f"{name}_sum {_number(total)}")
                lines.append(f"{name}_count {count}")
            if name in self._gauges:
                reading = self._gauges[name]()
                if reading is not None:
                    lines.append(f"{name} {_number(reading)}")
            if name in families:
                series = sorted((tuple(sorted(labels.items())), value) for labels, value in families[name]())
                lines.extend(f"{name}{_labels(labels)} {_number(value)}" for labels, value in series)
        return "\n".join(lines) + "\n"


def resident_memory_bytes() -> float | None:
    """This process's resident set size from /proc/self/statm (Linux); None elsewhere, where
    `process_resident_memory_bytes` is then not exported."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            resident_pages = int(statm.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return float(resident_pages * os.sysconf("SC_PAGE_SIZE"))


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))
