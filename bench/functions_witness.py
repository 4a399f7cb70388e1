"""Reading what happened from the witnesses of a running world, never from the bench's own plans.

- The simulator's log: "event <id> added" is the moment its document first showed the event
  (the notice); its approval log has every StartRequests POST it received, with the outcome.
- An agent's command ledger (`<state dir>/commands.db`): when the agent began a command
  (`received_at`, written just before it acts) and when it finished it (`updated_at`, written
  right after: for a drain, after /readyz turned unready).
- An agent's outbox (`<state dir>/agent.db`): which envelopes it published.

Times are Unix seconds; stage timings are milliseconds after the notice.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from bench.results import percentile
from wire.timefmt import parse_rfc3339

_ADDED = re.compile(r"^event (\S+) added")


def epoch(text: str) -> float:
    """Unix seconds of an RFC 3339 timestamp (the simulator logs milliseconds)."""
    return parse_rfc3339(text).timestamp()


def moment(entry: Mapping[str, object]) -> float:
    """When a simulator log or approval entry happened: its `unix_time` (the system clock, to the
    microsecond) where the simulator gives one, else its RFC 3339 `time` (milliseconds)."""
    exact = entry.get("unix_time")
    if isinstance(exact, (int, float)) and not isinstance(exact, bool):
        return float(exact)
    return epoch(str(entry["time"]))


def notices(log_entries: Iterable[Mapping[str, object]]) -> dict[str, float]:
    """Lower-cased EventId → when the simulator's document first showed it."""
    found: dict[str, float] = {}
    for entry in log_entries:
        match = _ADDED.match(str(entry.get("message", "")))
        if match is not None:
            found.setdefault(match.group(1).lower(), moment(entry))
    return found


def _event_ids(entry: Mapping[str, object]) -> list[str]:
    ids = entry.get("event_ids")
    return [str(event_id).lower() for event_id in ids] if isinstance(ids, list) else []


def accepted_approvals(approvals: Iterable[Mapping[str, object]]) -> dict[str, float]:
    """Lower-cased EventId → when the simulator accepted the first StartRequests POST naming it."""
    found: dict[str, float] = {}
    for entry in approvals:
        if entry.get("outcome") == "accepted":
            for event_id in _event_ids(entry):
                found.setdefault(event_id, moment(entry))
    return found


def approval_posts(approvals: Iterable[Mapping[str, object]], event_id: str) -> list[Mapping[str, object]]:
    """Every POST of StartRequests from a VM (not a scenario step) that named `event_id`, whatever its outcome."""
    wanted = event_id.lower()
    return [entry for entry in approvals if entry.get("source") == "http" and wanted in _event_ids(entry)]


@dataclass(frozen=True)
class LedgerRow:
    command_id: str
    type: str  # approve | drain | restore
    event_id: str
    state: str  # held | executing | done
    accepted: bool | None
    received_at: float  # the agent began it
    updated_at: float  # the agent finished it (state done)


def read_ledger(path: Path) -> list[LedgerRow]:
    """An agent's command ledger, oldest command first (read only; [] while it does not exist)."""
    if not path.exists():
        return []
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
        try:
            rows = db.execute(
                "SELECT command_id, type, event_id, state, accepted, received_at, updated_at FROM commands "
                "ORDER BY received_at"
            ).fetchall()
        except sqlite3.OperationalError:  # the agent has not created its table yet
            return []
    return [
        LedgerRow(str(cid), str(kind), str(event), str(state), None if ok is None else bool(ok), float(got), float(upd))
        for cid, kind, event, state, ok, got, upd in rows
    ]


def first_done(rows: Sequence[LedgerRow], kind: str, after: float) -> LedgerRow | None:
    """The first command of `kind` the agent accepted and finished after `after`."""
    done = [
        row for row in rows if row.type == kind and row.state == "done" and row.accepted and row.updated_at >= after
    ]
    return min(done, key=lambda row: row.updated_at, default=None)


def published(outbox: Path, envelope_id: str) -> bool:
    """Whether the agent whose outbox this is published the envelope (read only)."""
    if not outbox.exists():
        return False
    with closing(sqlite3.connect(f"file:{outbox}?mode=ro", uri=True, timeout=5)) as db:
        try:
            row = db.execute(
                "SELECT 1 FROM outbox WHERE envelope_id = ? AND published_at IS NOT NULL LIMIT 1", (envelope_id,)
            ).fetchone()
        except sqlite3.OperationalError:
            return False
    return row is not None


def after_notice_ms(notice: float, moment: float | None) -> float | None:
    return None if moment is None else (moment - notice) * 1000.0


@dataclass(frozen=True)
class StageSummary:
    stage: str
    p50: float
    p99: float
    count: int


def summarise(samples: Sequence[Mapping[str, float | None]], stages: Sequence[str]) -> list[StageSummary]:
    """p50 and p99 of each stage over the samples that saw it (stages no sample saw are left out)."""
    summaries = []
    for stage in stages:
        values = [value for sample in samples if (value := sample.get(stage)) is not None]
        if values:
            summaries.append(StageSummary(stage, percentile(values, 0.50), percentile(values, 0.99), len(values)))
    return summaries


def describe_sample(sample: Mapping[str, float | None], stages: Sequence[str]) -> str:
    """'detected +812, published +830, ...' in stage order (stages the sample did not see are left out)."""
    return ", ".join(f"{stage} +{value:.0f}" for stage in stages if (value := sample.get(stage)) is not None)


def where_the_time_goes(samples: Sequence[Mapping[str, float | None]], stages: Sequence[str]) -> str:
    """The median of each step, over the samples that saw both ends:
    'notice→detected 480 ms, detected→published 12 ms, ...'."""
    steps = []
    previous = "notice"
    for stage in stages:
        spans = []
        for sample in samples:
            end = sample.get(stage)
            start = 0.0 if previous == "notice" else sample.get(previous)
            if end is not None and start is not None:
                spans.append(end - start)
        if spans:
            steps.append(f"{previous}→{stage} {percentile(spans, 0.50):.0f} ms")
            previous = stage
    return ", ".join(steps)
