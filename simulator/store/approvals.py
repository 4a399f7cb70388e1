"""What the simulator records of each approval (StartRequests POST) and what it answers.

The approval log is what tells an ignored EventId apart from an accepted one, since IMDS answers
200 to both; the outcomes are ordered by consequence so one POST reports one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict


class ApprovalRecord(TypedDict):
    time: str
    sim_time: float
    vm: str
    event_ids: list[str]
    status: int | None
    outcome: str
    source: str


@dataclass(frozen=True)
class ApprovalResult:
    status: int
    outcome: str
    message: str = ""


# One outcome per POST: the most consequential one among its EventIds.
_OUTCOMES_BY_CONSEQUENCE = ("accepted", "waiting-for-others", "already-approved", "already-started", "not-in-resources")


def most_consequential(outcomes: Sequence[str]) -> str:
    return next((o for o in _OUTCOMES_BY_CONSEQUENCE if o in outcomes), "unknown-event")
