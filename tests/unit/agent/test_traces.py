"""How many traces the agent keeps, and which it lets go (agent/traces.py)."""

from __future__ import annotations

from dataclasses import replace

from agent.traces import MAX_TRACES, Traces
from tests.factories import azure_event
from wire.model import EventStatus


def test_the_oldest_traces_go_once_the_most_are_kept_and_a_step_keeps_its_event_young() -> None:
    # GIVEN an agent that kept the trace of MAX_TRACES open events
    events = [azure_event(event_id=f"E-{n}") for n in range(MAX_TRACES)]
    traces = Traces(None)
    contexts, kept = traces.plan(events)
    traces.commit(kept)

    # WHEN the first event starts, and then one more event is seen
    (first_started,), kept = traces.plan([replace(events[0], status=EventStatus.STARTED)])
    traces.commit(kept)
    _, kept = traces.plan([azure_event(event_id="E-NEW")])

    # THEN the first keeps its trace (its step made it the latest), and the one seen longest ago goes
    assert first_started.trace_id == contexts[0].trace_id
    assert len(kept) == MAX_TRACES
    assert "azure:e-1" not in kept
    assert kept["azure:e-0"] == contexts[0].trace_id
    # AND what is saved reads back the same after a restart
    traces.commit(kept)
    assert Traces(Traces.saved(kept)).plan([])[1] == kept


def test_an_event_id_is_one_event_in_any_case_on_azure() -> None:
    traces = Traces(None)
    (upper,), kept = traces.plan([azure_event(event_id="C7061BAC-AFDC")])
    traces.commit(kept)
    (lower,), _ = traces.plan([azure_event(event_id="c7061bac-afdc", status=EventStatus.STARTED)])
    assert lower.trace_id == upper.trace_id
    assert lower.span_id != upper.span_id
