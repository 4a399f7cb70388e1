"""The telemetry port: what one invocation of the functions was, handed to whatever exports spans and metrics.

The trace of a maintenance already reaches the audit log, the log lines and the commands
(functions/core/tracing.py). An exporter outside the core (functions/telemetry, MBRIDGE_TELEMETRY)
turns each `InvocationReport` into a span of that trace, with the very ids the commands and the
audit records carry, and into counts and latencies. The core knows no telemetry library: it fills
one small record per invocation and calls `Telemetry.invocation` once, after the invocation ended,
whether it succeeded, refused the message or failed.

Every entry point reports the same shape, its `operation` naming which (`reporting` in
functions/core/invocation.py): `process`, an agent's message; `central`, one delivery of a feed of
the control plane or one pass over a polled one; `sweep`, one pass of the silent-agent sweep;
`recover`, one `mbridge recover restore`.

Off by default (`NO_TELEMETRY`): nothing beyond the record is built, and nothing is imported.
Times are the invocation's own (its `now`, and `Deps.monotonic` for how long it took), so a
report is as deterministic as the invocation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from functions.core.log_fields import fields
from wire.tracecontext import TraceContext

LOGGER = logging.getLogger("mbridge.functions")

# What `InvocationReport.result` says of an invocation that raised (the platform redelivers it).
FAILED = "failed"
# A refusal of a verified proof reused with another key (process: "proof-reused").
PROOF_REUSED = "proof-reused"
# What an invocation that acted on nothing and refused nothing came to (a sweep that found no one).
NOTHING = "none"
# The operations (`InvocationReport.operation`): the entry points that report.
PROCESS, CENTRAL, SWEEP, RECOVER = "process", "central", "sweep", "recover"
OPERATIONS = (PROCESS, CENTRAL, SWEEP, RECOVER)


@dataclass(frozen=True)
class ActionTiming:
    """One action of the invocation, with what its latencies are measured from."""

    action: str  # an ActionName's text: drain, approve, restore, wait, ...
    taken_at: datetime  # when it was taken, on the invocation's clock
    noticed_at: datetime  # when the agent saw the step it answers (its envelope's time)
    not_before: datetime | None  # the event's NotBefore as reported (None: none)


@dataclass
class InvocationReport:
    """One invocation as the core saw it; filled as the invocation learns it.

    An invocation of several events (a feed's message or pass, a sweep) names the first one's
    event, and its VM when that names one; its actions and waits are all of theirs.

    `trace` is the invocation's own span (its span id is the one the commands for the event carry),
    `parent_span_id` the envelope's span; None for both when no envelope was decoded (a malformed
    message). A trace context the envelope carried but that is not one leaves `parent_span_id`
    None and `trace` a trace the functions started, as in the audit log.
    """

    started: datetime  # the invocation's `now`
    began: float  # `Deps.monotonic` when it started
    ended: datetime | None = None
    trace: TraceContext | None = None
    parent_span_id: str | None = None
    result: str = ""  # a Result's text, or FAILED
    error: str = ""  # the type of the exception that failed it
    envelope_id: str = ""
    event_id: str = ""
    vm: str = ""
    cloud: str = ""
    # Each message or notice refused, in order: unverified | not-self | malformed | proof-reused
    # (process), notice-refused | malformed (central), recovery-refused (recover).
    refusals: tuple[str, ...] = ()
    actions: tuple[ActionTiming, ...] = ()
    # Seconds each event admitted from a budget's waiting line by this invocation had waited.
    budget_waits: tuple[float, ...] = ()
    operation: str = PROCESS
    source: str = ""  # the control plane's feed (central): event-grid, resource-graph, ...
    # The spans of the VMs' parts an invocation of several acted on (central, sweep), each in its
    # maintenance's trace: the invocation's span links to them (it is a root span of its own).
    links: tuple[TraceContext, ...] = ()

    def refuse(self, reason: str) -> None:
        self.refusals += (reason,)

    @property
    def seconds(self) -> float:
        return 0.0 if self.ended is None else max(0.0, (self.ended - self.started).total_seconds())

    def attributes(self) -> Mapping[str, str]:
        """The invocation's attributes, those known (empty texts left out)."""
        known = {
            "event_id": self.event_id,
            "vm": self.vm,
            "cloud": self.cloud,
            "result": self.result,
            "envelope_id": self.envelope_id,
            "source": self.source,
            "refusal": ",".join(dict.fromkeys(self.refusals)),
            "error": self.error,
        }
        return {name: value for name, value in known.items() if value}


class Telemetry(Protocol):
    def invocation(self, report: InvocationReport) -> None:
        """Export one invocation. Called once per invocation, on its thread, after it ended; must
        not block on the network (exporters batch) and should not raise (what it raises is logged
        and dropped: telemetry never fails an invocation)."""
        ...


class NoTelemetry:
    """The default: nothing exported, nothing imported."""

    def invocation(self, report: InvocationReport) -> None:
        return None


NO_TELEMETRY = NoTelemetry()


def report(telemetry: Telemetry, invocation: InvocationReport) -> None:
    """Hand the report over; an exporter's failure is logged, never the invocation's."""
    try:
        telemetry.invocation(invocation)
    except Exception:
        LOGGER.warning(
            "telemetry of %s invocation %s not exported",
            invocation.operation,
            invocation.envelope_id[:16],
            exc_info=True,
            extra=fields(envelope_id=invocation.envelope_id),
        )
