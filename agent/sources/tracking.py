"""Trackers hold a source's last observed state and turn observations into events.

`apply` is side-effect free: it returns what the new state and events would be; the loop records
both in one transaction and only then calls `commit`. So the in-memory state never runs ahead of
what is on disk.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Generic, Protocol, TypeVar

from wire.model import MaintenanceEvent

StateT = TypeVar("StateT")


class Observation(Protocol):
    """A change a watcher saw, and when: each cloud's client defines its own."""

    @property
    def observed_at(self) -> datetime: ...

    @property
    def lag_bound(self) -> float:
        """The longest the change can have been visible before the agent saw it."""
        ...


@dataclass(frozen=True)
class Applied(Generic[StateT]):
    state: StateT
    state_json: Any
    events: list[MaintenanceEvent]


# The lowercased EventIds this agent has approved (its command ledger), read when an event goes away.
Approvals = Callable[[], Collection[str]]


def none_approved() -> Collection[str]:
    return frozenset()


class Tracker(Protocol):
    state_name: str

    def apply(self, observation: Observation) -> Applied[Any]: ...

    def follow_approvals(self, approvals: Approvals) -> None:
        """Where to learn which events this agent approved (an approved event that goes away ran)."""
        ...

    def commit(self, applied: Applied[Any]) -> None: ...

    def impact_pending(self) -> str | None:
        """Why this VM should not take traffic now, or None."""
        ...
