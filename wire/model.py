"""The one maintenance-event model shared by the agent and both clouds' functions.

Every cloud notice, whatever its source, becomes a `MaintenanceEvent` with a kind, a status
and the original payload fragment (docs/contracts.md#envelope, #event-lifecycle).
Behaviour never lives here: events are plain data, decisions are derived from
them by pure functions elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from enum import Enum
from typing import Any

SCHEMA_VERSION = 1

JsonObject = dict[str, Any]


class Cloud(str, Enum):
    AZURE = "azure"
    GCE = "gce"


class EventKind(str, Enum):
    # Azure Scheduled Events EventType values
    FREEZE = "freeze"
    REBOOT = "reboot"
    REDEPLOY = "redeploy"
    PREEMPT = "preempt"
    TERMINATE = "terminate"
    # GCE metadata keys and values
    LIVE_MIGRATE = "live_migrate"
    HOST_TERMINATE = "host_terminate"
    UPCOMING = "upcoming"
    # Either cloud: a notice whose type could not be read (a type added after this release, or
    # a garbled one). Forwarded all the same, and handled conservatively by the policy.
    UNKNOWN = "unknown"


# A Freeze this short is harmless (rule 3 of docs/policy.md): the policy does not drain for it and
# the agent's /readyz stays ready. Both sides take this default, and both can be told another value
# (the policy's harmless_freeze_seconds, the agent's --harmless-freeze-seconds).
DEFAULT_HARMLESS_FREEZE_SECONDS = 10

KINDS_BY_CLOUD: Mapping[Cloud, frozenset[EventKind]] = {
    Cloud.AZURE: frozenset(
        {
            EventKind.FREEZE,
            EventKind.REBOOT,
            EventKind.REDEPLOY,
            EventKind.PREEMPT,
            EventKind.TERMINATE,
            EventKind.UNKNOWN,
        }
    ),
    Cloud.GCE: frozenset(
        {EventKind.LIVE_MIGRATE, EventKind.HOST_TERMINATE, EventKind.PREEMPT, EventKind.UPCOMING, EventKind.UNKNOWN}
    ),
}


class EventStatus(str, Enum):
    SCHEDULED = "scheduled"
    STARTED = "started"
    COMPLETED = "completed"
    CANCELED = "canceled"


class EventSource(str, Enum):
    PLATFORM = "platform"
    USER = "user"


@dataclass(frozen=True)
class MaintenanceEvent:
    """One maintenance notice at one point of its lifecycle, as one VM reported it.

    `event_id` is the cloud's id (Azure EventId in its original case) or, for GCE,
    the derived id of docs/contracts.md#deterministic-ids. `reporter` is the VM that observed it;
    `sequence` the DocumentIncarnation or ETag of the document it came from.
    `unreadable` names the fields of the cloud's entry that could not be read (their value is then
    empty here, and the original text is in `raw`): such an event is forwarded all the same,
    because a missed maintenance is worse than an imprecise one.
    """

    cloud: Cloud
    event_id: str
    kind: EventKind
    status: EventStatus
    reporter: str
    sequence: str
    resources: tuple[str, ...] = ()
    not_before: datetime | None = None
    duration_seconds: int | None = None
    event_source: EventSource | None = None
    description: str = ""
    raw: JsonObject = field(default_factory=dict, compare=True, hash=False)
    schema_version: int = SCHEMA_VERSION
    unreadable: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.event_id:
            raise ValueError("event_id must not be empty")
        if not self.reporter:
            raise ValueError("reporter (the observing VM's name) must not be empty")
        if self.kind not in KINDS_BY_CLOUD[self.cloud]:
            allowed = ", ".join(sorted(k.value for k in KINDS_BY_CLOUD[self.cloud]))
            raise ValueError(
                f"kind {self.kind.value!r} does not exist on {self.cloud.value}; expected one of {allowed}"
            )
        if self.not_before is not None and self.not_before.utcoffset() is None:
            raise ValueError("not_before must be timezone-aware (UTC)")
        if self.not_before is not None and self.not_before.tzinfo is not timezone.utc:
            object.__setattr__(self, "not_before", self.not_before.astimezone(timezone.utc))
        if isinstance(self.resources, list):  # tolerate lists from callers; keep the value immutable
            object.__setattr__(self, "resources", tuple(self.resources))
        if isinstance(self.unreadable, list):
            object.__setattr__(self, "unreadable", tuple(self.unreadable))

    @property
    def fully_read(self) -> bool:
        """Whether the cloud's notice was understood: its kind is known and every field was read."""
        return self.kind is not EventKind.UNKNOWN and not self.unreadable

    @property
    def concerns_reporter(self) -> bool:
        """Whether the reporting VM is itself affected (it is named in `resources`)."""
        return self.reporter in self.resources

    def with_status(self, status: EventStatus, *, sequence: str) -> MaintenanceEvent:
        """The same event at a later lifecycle step (e.g. gone after Started → completed)."""
        return replace(self, status=status, sequence=sequence)


@dataclass(frozen=True)
class CommandResult:
    """What an agent did with a command (docs/contracts.md#results): accepted or rejected, and why."""

    command_id: str
    accepted: bool
    event_id: str
    target: str
    reason: str = ""
    # The trace of the command's maintenance (wire/tracecontext.py), "" when the command carried none:
    # the result envelope carries it on. Not part of what the result is (a stored result answers a
    # replay whatever its trace).
    trace_id: str = field(default="", compare=False)

    @property
    def result(self) -> str:
        return "accepted" if self.accepted else "rejected"
