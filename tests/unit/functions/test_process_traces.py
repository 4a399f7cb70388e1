"""process() and the trace of a maintenance: its records, log lines and commands carry the trace the
report brought, a trace never decides anything, and agents older than traces get none."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from functions.core.balancers import ReadinessBalancer
from functions.core.policy import Policy
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.commands import Command, decode_command, encode_command
from wire.envelope import encode, envelope_for_command_result, envelope_for_event
from wire.identity import ReporterName
from wire.model import Cloud, CommandResult, EventKind, EventStatus, MaintenanceEvent
from wire.tracecontext import TRACEPARENT, TRACESTATE, TraceContext, new_trace

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def store() -> Iterator[SqliteStore]:
    store = SqliteStore(":memory:")
    yield store
    store.close()


def deps(store: SqliteStore, sent: RecordingSender, balancer: Any = None) -> Deps:
    return Deps(
        store=store,
        balancer=balancer if balancer is not None else FakeBalancer({"web": ("web-0", "web-1")}),
        sender=sent,
        audit=store,
        policy=Policy(),
        verifier=ReporterName(),  # the sender is the reporter: trust itself is tested in test_trust.py
        monotonic=FakeClock(NOW).monotonic,
    )


def reboot(status: EventStatus = EventStatus.SCHEDULED) -> MaintenanceEvent:
    return azure_event(kind=EventKind.REBOOT, status=status, reporter="web-0", resources=("web-0",), event_id="E-1")


def report(event: MaintenanceEvent, extensions: dict[str, Any] | None = None) -> bytes:
    return encode(envelope_for_event(event, NOW, extensions))


def carried(command: Command) -> TraceContext:
    """The trace context of a command as the agent reads it off the wire."""
    trace = decode_command(encode_command(command)).command.trace
    assert trace is not None
    return trace


def test_every_record_log_line_and_command_of_a_traced_report_carries_its_trace(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a platform Reboot of web-0 reported with a trace and a vendor's tracestate
    trace = TraceContext(new_trace().trace_id, new_trace().span_id, "01", "rojo=00f067aa0ba902b7")
    sent = RecordingSender()

    # WHEN it is processed
    with caplog.at_level(logging.INFO, logger="mbridge.functions"):
        outcome = process(report(reboot(), trace.attributes()), deps(store, sent), NOW)

    # THEN the report, the decision, the drain and the approval are audited under its trace id
    assert [(line.kind, line.action) for line in store.query()] == [
        ("event", ""),
        ("decision", ""),
        ("action", "drain"),
        ("action", "approve"),
    ]
    assert {line.trace_id for line in store.query()} == {trace.trace_id}
    assert outcome.trace_id == trace.trace_id
    # AND the lines logged about the actions name it
    actions = [r for r in caplog.records if getattr(r, "action", None) in ("drain", "approve")]
    assert len(actions) == 2
    assert {getattr(r, "trace_id", None) for r in actions} == {trace.trace_id}
    # AND the approval carries the trace onward: a span of the functions' own, the vendors' state kept
    (approval,) = sent.commands
    onward = carried(approval)
    assert (onward.trace_id, onward.tracestate) == (trace.trace_id, trace.tracestate)
    assert onward.span_id != trace.span_id


def test_a_report_of_an_agent_older_than_traces_starts_one_and_its_agent_gets_commands_it_reads(
    store: SqliteStore,
) -> None:
    # GIVEN a report without a trace context (an agent older than traces)
    sent = RecordingSender()

    # WHEN it is processed
    process(report(reboot()), deps(store, sent), NOW)

    # THEN its records share a trace of their own, and the approval carries none: that agent refuses
    # a command field it does not know
    (trace_id,) = {line.trace_id for line in store.query()}
    assert len(trace_id) == 32
    (approval,) = sent.commands
    assert approval.trace is None
    assert TRACEPARENT not in approval.to_wire()


@pytest.mark.parametrize(
    "extensions",
    [
        {TRACEPARENT: "00-" + "0" * 32 + "-00f067aa0ba902b7-01"},
        {TRACEPARENT: "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", TRACESTATE: "rojo=1"},
        {TRACEPARENT: "00-" + "a" * 100_000},
        {TRACEPARENT: 12},
    ],
)
def test_a_trace_context_that_is_not_one_is_logged_ignored_and_changes_nothing_else(
    store: SqliteStore, caplog: pytest.LogCaptureFixture, extensions: dict[str, Any]
) -> None:
    # GIVEN the same report twice: as the agent sent it, and with a trace context no agent writes
    plain, odd = SqliteStore(":memory:"), store
    sent_plain, sent_odd = RecordingSender(), RecordingSender()

    # WHEN each is processed
    process(report(reboot()), deps(plain, sent_plain), NOW)
    with caplog.at_level(logging.WARNING, logger="mbridge.functions"):
        outcome = process(report(reboot(), extensions), deps(odd, sent_odd), NOW)

    # THEN the odd one is acted on exactly as the plain one, under a trace of its own, with the
    # warning saying why its own was ignored (never repeating it)
    assert outcome.result == "processed"
    assert [(r.kind, r.action, r.reason) for r in odd.query()] == [(r.kind, r.action, r.reason) for r in plain.query()]
    (trace_id,) = {line.trace_id for line in odd.query()}
    assert len(trace_id) == 32
    assert trace_id != "0" * 32
    assert [c.trace for c in sent_odd.commands] == [None]
    (warning,) = [r for r in caplog.records if "trace context that is not one" in r.getMessage()]
    assert getattr(warning, "trace_id", None) == trace_id
    assert "a" * 100 not in warning.getMessage()
    plain.close()


def test_drains_and_restores_through_readyz_carry_the_trace_of_the_step_they_are_for(store: SqliteStore) -> None:
    # GIVEN VMs drained through their agents' /readyz, and a Reboot whose steps come with their traces
    sent = RecordingSender()
    readiness = ReadinessBalancer(sent, clock=lambda: NOW)
    scheduled = new_trace()
    completed = new_trace(scheduled.trace_id)  # the agent's next span of the same maintenance

    # WHEN it is scheduled and then completed
    process(report(reboot(), scheduled.attributes()), deps(store, sent, readiness), NOW)
    process(report(reboot(EventStatus.COMPLETED), completed.attributes()), deps(store, sent, readiness), NOW)

    # THEN the drain, the approval and the restore all carry the maintenance's trace, each step's
    # commands the span of the invocation that sent them
    assert [c.type.value for c in sent.commands] == ["drain", "approve", "restore"]
    traces = [carried(c) for c in sent.commands]
    assert {t.trace_id for t in traces} == {scheduled.trace_id}
    assert traces[0].span_id == traces[1].span_id != traces[2].span_id
    assert scheduled.span_id not in {t.span_id for t in traces}
    assert {line.trace_id for line in store.query()} == {scheduled.trace_id}


def test_refused_and_duplicate_reports_are_audited_under_their_trace(store: SqliteStore) -> None:
    # GIVEN a traced report of an event of another VM, and a traced report delivered twice
    trace = new_trace()
    other = azure_event(reporter="web-1", resources=("web-0",), event_id="E-2")
    sent = RecordingSender()

    # WHEN they are processed
    process(report(other, trace.attributes()), deps(store, sent), NOW)
    body = report(reboot(), trace.attributes())
    process(body, deps(store, sent), NOW)
    duplicate = process(body, deps(store, sent), NOW)

    # THEN the refusal and the duplicate are recorded under the trace too
    kinds = {line.kind: line.trace_id for line in store.query()}
    assert kinds["not-self"] == kinds["duplicate"] == trace.trace_id
    assert duplicate.trace_id == trace.trace_id


def test_a_command_result_is_audited_under_the_trace_it_carries_or_none(store: SqliteStore) -> None:
    # GIVEN an agent's answer to a traced command, and one from an agent older than traces
    trace = new_trace()
    accepted = CommandResult("c-1", True, "E-1", "web-0", "approved", trace_id=trace.trace_id)
    older = CommandResult("c-2", True, "E-1", "web-0", "approved")
    sent = RecordingSender()

    # WHEN both are processed
    for result, extensions in ((accepted, trace.attributes()), (older, None)):
        process(encode(envelope_for_command_result(result, Cloud.AZURE, NOW, extensions)), deps(store, sent), NOW)

    # THEN each record carries what its result carried: a result starts no trace of its own
    assert [(line.kind, line.trace_id) for line in store.query()] == [
        ("command-result", trace.trace_id),
        ("command-result", ""),
    ]
