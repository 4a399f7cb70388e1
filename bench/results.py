"""What a benchmark reports: named figures with units and targets, collected into one JSON file.

Every figure carries its unit in the record (`ms`, `MB`, `ms/poll`, `events/s`, `count`, `ratio`,
`s`) and, where the project promises one, its target and whether this run met it. A target is
never loosened to make a run pass: a missed one is reported as missed, with a note saying why.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Target:
    """`value <op> limit` in the figure's unit; op is "<=" or ">=" (or "==" for counts)."""

    op: str
    limit: float

    def met(self, value: float) -> bool:
        if self.op == "<=":
            return value <= self.limit
        if self.op == ">=":
            return value >= self.limit
        if self.op == "==":
            return value == self.limit
        raise ValueError(f"unknown target operator {self.op!r}")

    def __str__(self) -> str:
        return f"{self.op} {self.limit:g}"


def at_most(limit: float) -> Target:
    return Target("<=", limit)


def at_least(limit: float) -> Target:
    return Target(">=", limit)


def exactly(limit: float) -> Target:
    return Target("==", limit)


@dataclass(frozen=True)
class Figure:
    name: str  # dotted, e.g. "detection.azure.p99"
    value: float | None  # None: could not be measured (the note says why)
    unit: str
    target: Target | None = None
    note: str = ""
    samples: int | None = None  # how many measurements the value summarises

    @property
    def met(self) -> bool | None:
        if self.target is None or self.value is None:
            return None
        return self.target.met(self.value)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": None if self.value is None else round(self.value, 3),
            "unit": self.unit,
            "target": str(self.target) if self.target else None,
            "met": self.met,
            "samples": self.samples,
            "note": self.note,
        }


def percentile(values: Sequence[float], fraction: float) -> float:
    """The `fraction` percentile (0 < fraction ≤ 1) by the nearest-rank method."""
    if not values:
        raise ValueError("no values to take a percentile of")
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def latency_figures(
    name: str, samples_ms: Sequence[float], *, p99_target: Target | None = None, note: str = ""
) -> list[Figure]:
    """p50, p99 and max of latencies in milliseconds, the p99 against its target."""
    count = len(samples_ms)
    if not count:
        return [Figure(f"{name}.p99", None, "ms", p99_target, note or "no samples", 0)]
    return [
        Figure(f"{name}.p50", percentile(samples_ms, 0.50), "ms", None, note, count),
        Figure(f"{name}.p99", percentile(samples_ms, 0.99), "ms", p99_target, note, count),
        Figure(f"{name}.max", max(samples_ms), "ms", None, note, count),
        Figure(f"{name}.mean", statistics.fmean(samples_ms), "ms", None, note, count),
    ]


@dataclass
class SectionResult:
    name: str
    seconds: float
    figures: list[Figure] = field(default_factory=list)
    error: str | None = None  # a section that failed says why; the others still run


def machine() -> dict[str, Any]:
    """Where the figures were measured."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = None
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory_gb = round(pages / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": memory_gb,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def git_revision() -> str | None:
    try:
        run = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 - git from PATH
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout.strip() or None


def report(mode: str, started_at: str, sections: Sequence[SectionResult]) -> dict[str, Any]:
    figures = [figure for section in sections for figure in section.figures]
    return {
        "schema": 1,
        "mode": mode,
        "started_at": started_at,
        "revision": git_revision(),
        "machine": machine(),
        "sections": [
            {
                "name": section.name,
                "seconds": round(section.seconds, 2),
                "error": section.error,
                "figures": [figure.as_json() for figure in section.figures],
            }
            for section in sections
        ],
        "summary": {
            "figures": len(figures),
            "targets": sum(1 for figure in figures if figure.met is not None),
            "missed": [figure.name for figure in figures if figure.met is False],
            "unmeasured": [figure.name for figure in figures if figure.value is None],
            "failed_sections": [section.name for section in sections if section.error],
        },
    }
