"""Telemetry of the entry points beside `process` (functions/core/invocation.py `reporting`): the control
plane's feed, the silent-agent sweep and `mbridge recover`; and the budget-wait histogram.

GIVEN the OpenTelemetry adapter on the SDK's in-memory span exporter and metric reader (test_telemetry.py)
WHEN  a feed's message is delivered, a table is reconciled, the sweep runs, an operator recovers a VM, or an
      event waits for its pool's slot and is admitted
THEN  each invocation is one span named for its operation, its actions and refusals are counted with the
      operation as a label, and a wait is measured on the invocations' clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from functions.azure_app.central_blueprint import handle_central
from functions.central.resource_graph import reconcile
from functions.core.central import EVENT_GRID, RESOURCE_GRAPH, process_central, sweep_silent
from functions.core.policy import Policy, Pool
from functions.core.process import Deps, process
from functions.core.recovery import Recovery, RecoveryRefusedError, recover
from functions.local_app.store import SqliteStore
from functions.telemetry.otel import ACTIONS, BUDGET_WAIT, INVOCATION_DURATION, REFUSALS
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from tests.unit.azure.test_central_blueprint import SCOPE, scheduled
from tests.unit.functions.test_central import central
from tests.unit.functions.test_central_reconcile import SCOPE as TABLE_SCOPE
from tests.unit.functions.test_central_reconcile import Table
from tests.unit.functions.test_central_reconcile import row as table_row
from tests.unit.functions.test_telemetry import NOW, Exported, reboot, report
from wire.identity import ReporterName
from wire.model import EventStatus

SET = ("web-0", "web-1", "web-2")


@dataclass
class Functions:
    """The SQLite store, the adapter on the in-memory exporter and reader, and the invocations' clock."""

    store: SqliteStore = field(default_factory=lambda: SqliteStore(":memory:"))
    exported: Exported = field(default_factory=Exported)
    clock: FakeClock = field(default_factory=lambda: FakeClock(NOW))

    def deps(self, policy: Policy | None = None) -> Deps:
        return Deps(
            store=self.store,
            balancer=FakeBalancer({"web": SET}),
            sender=RecordingSender(),
            audit=self.store,
            policy=policy or Policy(),
            verifier=ReporterName(),
            monotonic=self.clock.monotonic,
            telemetry=self.exported.telemetry,
        )


@pytest.fixture
def functions() -> Iterator[Functions]:
    made = Functions()
    yield made
    made.exported.telemetry.shutdown()
    made.store.close()


def spans(functions: Functions) -> list[tuple[str, Any, Any]]:
    """The spans exported so far: name, kind and result."""
    return [
        (span.name, span.kind, (span.attributes or {}).get("mbridge.result", ""))
        for span in functions.exported.spans.get_finished_spans()
    ]


def test_a_delivered_central_message_is_one_central_span_counting_what_it_refused(functions: Functions) -> None:
    # GIVEN an Event Grid message of three: web-0's Reboot, another group's VM's, and one that is no event
    body = json.dumps([scheduled("web-0"), scheduled("web-0", group="sandbox-rg"), 5]).encode()

    # WHEN it is delivered
    outcomes = handle_central(body, functions.deps(), SCOPE, NOW)

    # THEN one span of operation central reports it, naming the feed and web-0's event
    assert len(outcomes) == 1
    (span,) = functions.exported.spans.get_finished_spans()
    assert (span.name, span.kind) == ("mbridge.central", SpanKind.CONSUMER)
    assert span.attributes is not None
    assert span.attributes["mbridge.source"] == EVENT_GRID
    assert span.attributes["mbridge.vm"] == "web-0"
    assert span.attributes["mbridge.result"] == "processed"
    assert span.attributes["mbridge.refusal"] == "notice-refused,malformed"
    assert span.start_time == span.end_time  # on the invocation's clock, which did not move
    # AND it is a root span of its own that links to web-0's part in the maintenance's trace (its audit records')
    assert span.parent is None
    traced = {record.trace_id for record in functions.store.query(vm="web-0") if record.trace_id}
    assert len(traced) == 1
    assert [format(link.context.trace_id, "032x") for link in span.links] == list(traced)
    # AND the two it did not act on are counted as refusals of the central operation
    assert functions.exported.points(REFUSALS) == {
        (("operation", "central"), ("reason", "notice-refused")): 1,
        (("operation", "central"), ("reason", "malformed")): 1,
    }


def test_a_message_that_is_not_json_is_a_central_span_of_its_refusal(functions: Functions) -> None:
    handle_central(b"not json", functions.deps(), SCOPE, NOW)

    assert spans(functions) == [("mbridge.central", SpanKind.CONSUMER, "malformed")]


def test_each_reconciliation_pass_is_one_central_span_whatever_it_read(functions: Functions) -> None:
    # GIVEN Resource Graph's table with web-0's and web-1's Reboot, and a row of another group's VM
    table = Table([table_row(EventStatus.SCHEDULED, ("web-0", "web-1")), table_row(EventStatus.SCHEDULED, group="x")])
    run = functions.deps()

    # WHEN two passes read it
    reconcile(table, run, TABLE_SCOPE, NOW)
    reconcile(table, run, TABLE_SCOPE, NOW)

    # THEN each pass is one span: the first acted, the second found only what it had seen
    assert spans(functions) == [
        ("mbridge.central", SpanKind.CONSUMER, "processed"),
        ("mbridge.central", SpanKind.CONSUMER, "duplicate"),
    ]
    first = functions.exported.spans.get_finished_spans()[0]
    assert first.attributes is not None
    assert first.attributes["mbridge.source"] == RESOURCE_GRAPH
    assert "mbridge.vm" not in first.attributes  # a report of two VMs names none
    assert len(first.links) == 2  # one per VM's part it acted on, each in its own maintenance's trace
    assert len({link.context.trace_id for link in first.links}) == 2
    assert functions.exported.points(REFUSALS) == {(("operation", "central"), ("reason", "notice-refused")): 2}
    assert {key: count for key, (count, _) in functions.exported.points(INVOCATION_DURATION).items()} == {
        (("operation", "central"), ("result", "processed")): 1,
        (("operation", "central"), ("result", "duplicate")): 1,
    }


def test_a_sweep_is_one_sweep_span_counting_the_drains_it_took_on_the_centres_word(functions: Functions) -> None:
    # GIVEN the centre reported web-0's Reboot and its agent stayed silent, with policy silent_agents: drain
    clock = functions.clock
    policy = Policy(silent_agents="drain")
    process_central(central(EventStatus.SCHEDULED), functions.deps(policy), clock.now())

    # WHEN a sweep runs before the bound, and one after it
    sweep_silent(functions.deps(policy), clock.now())
    clock.advance(policy.silent_agent_seconds + 1)
    found = sweep_silent(functions.deps(policy), clock.now())

    # THEN each sweep is a span of its own (the process_central call alone opened none), the first
    # finding no one, the second draining web-0, which is counted as an action of the sweep
    assert len(found) == 1
    assert spans(functions) == [
        ("mbridge.sweep", SpanKind.INTERNAL, "none"),
        ("mbridge.sweep", SpanKind.INTERNAL, "processed"),
    ]
    assert functions.exported.points(ACTIONS) == {(("action", "drain"), ("operation", "sweep")): 1}


def test_a_recovery_is_one_recover_span_and_a_refused_one_counts_a_refusal(functions: Functions) -> None:
    # GIVEN web-0 drained for its Reboot, whose end was never seen
    run = functions.deps()
    process(report(reboot()), run, NOW)
    request = Recovery(vm="web-0", event_id="E-1", operator="ops@example", reason="completion lost")

    # WHEN an operator recovers it without --force, and then with it
    with pytest.raises(RecoveryRefusedError):
        recover(run, request, NOW)
    recover(run, Recovery(**{**request.__dict__, "force": True}), NOW)

    # THEN the refused run is a span whose result is its refusal (not a failure: nothing went wrong),
    # with the refusal counted; the other put web-0 back
    (_, refused, done) = functions.exported.spans.get_finished_spans()
    assert (refused.name, refused.kind, refused.status.status_code) == (
        "mbridge.recover",
        SpanKind.INTERNAL,
        StatusCode.UNSET,
    )
    assert refused.attributes is not None
    assert refused.attributes["mbridge.result"] == "recovery-refused"
    assert "error.type" not in refused.attributes
    assert (done.name, done.status.status_code) == ("mbridge.recover", StatusCode.UNSET)
    assert done.attributes is not None
    assert (done.attributes["mbridge.vm"], done.attributes["mbridge.result"]) == ("web-0", "processed")
    assert functions.exported.points(REFUSALS) == {(("operation", "recover"), ("reason", "recovery-refused")): 1}
    assert functions.exported.points(ACTIONS)[(("action", "restore"), ("operation", "recover"))] == 1


def test_an_event_that_waited_for_its_pools_slot_records_the_wait_on_the_invocations_clock(
    functions: Functions,
) -> None:
    # GIVEN a pool of one slot, held by web-0's Reboot E-1
    clock = functions.clock
    run = functions.deps(Policy(pools=(Pool("web", frozenset(SET), max_drained=1),)))
    process(report(reboot()), run, clock.now())
    # AND web-1's Reboot E-2 reported 30 s later, which waits for the slot
    clock.advance(30)
    waiting = process(report(reboot(reporter="web-1", resources=("web-1",), event_id="E-2")), run, clock.now())
    assert [taken.action.value for taken in waiting.actions] == ["wait"]
    assert functions.exported.points(BUDGET_WAIT) == {}

    # WHEN E-1 completes 75 s after that, freeing the slot for E-2
    clock.advance(75)
    done = process(report(reboot(status=EventStatus.COMPLETED, not_before=None)), run, clock.now())

    # THEN E-2 is admitted, and the completion's invocation records that it waited 75 s
    assert [(taken.action.value, taken.vm) for taken in done.actions] == [
        ("restore", "web-0"),
        ("drain", "web-1"),
        ("approve", "web-1"),
    ]
    assert functions.exported.points(BUDGET_WAIT) == {(("operation", "process"),): (1, 75.0)}
