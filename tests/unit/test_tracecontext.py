"""W3C trace context: what is written, and how strictly what comes from a bus is read."""

from __future__ import annotations

import pytest

from wire.tracecontext import (
    MAX_TRACESTATE_CHARS,
    TRACEPARENT,
    TRACESTATE,
    TraceContext,
    TraceContextError,
    is_trace_id,
    new_trace,
    parse,
    received,
)

# The example of the W3C recommendation.
TRACEPARENT_EXAMPLE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_new_trace_is_a_version_00_traceparent_that_reads_back_the_same() -> None:
    started = new_trace()
    assert parse(started.traceparent) == started
    assert started.traceparent.startswith("00-")
    assert started.traceparent.endswith("-01")
    assert is_trace_id(started.trace_id)
    assert len(started.span_id) == 16


def test_the_steps_of_one_trace_share_its_id_and_each_has_a_span_of_its_own() -> None:
    first = new_trace()
    later = new_trace(first.trace_id)
    child = first.child()
    assert later.trace_id == child.trace_id == first.trace_id
    assert len({first.span_id, later.span_id, child.span_id}) == 3
    assert new_trace().trace_id != first.trace_id


def test_the_example_of_the_recommendation_is_read_with_its_tracestate() -> None:
    context = parse(TRACEPARENT_EXAMPLE, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
    assert context == TraceContext(
        "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    )
    assert context.attributes() == {TRACEPARENT: TRACEPARENT_EXAMPLE, TRACESTATE: context.tracestate}
    # a child keeps the vendors' state and flags, with a span of its own
    child = context.child()
    assert (child.trace_id, child.flags, child.tracestate) == (context.trace_id, "01", context.tracestate)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (TRACEPARENT_EXAMPLE.upper(), "lowercase"),
        ("01" + TRACEPARENT_EXAMPLE[2:], "version 00"),
        ("ff" + TRACEPARENT_EXAMPLE[2:], "version 00"),
        (TRACEPARENT_EXAMPLE + "-00", "55"),  # a later version's extra field is not version 00
        (TRACEPARENT_EXAMPLE[:-1], "55"),
        ("00-" + "0" * 32 + "-00f067aa0ba902b7-01", "all-zero trace id"),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01", "all-zero parent id"),
        ("00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", "lowercase"),
        ("00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", "lowercase hex"),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x", "lowercase hex"),
        ("x" * 10_000, "10000 characters"),
        (12, "must be a string"),
        (None, "must be a string"),
    ],
)
def test_anything_but_the_exact_version_00_form_is_refused_saying_why(value: object, why: str) -> None:
    with pytest.raises(TraceContextError, match=why):
        parse(value)


def test_an_error_never_repeats_the_value_it_refuses() -> None:
    with pytest.raises(TraceContextError) as caught:
        parse("00-" + "A" * 52)
    assert "AAAA" not in str(caught.value)


@pytest.mark.parametrize(
    "tracestate",
    [
        "",
        "Upper=1",  # keys are lowercase
        "rojo",  # no value
        "rojo=a,rojo=b",  # a key twice
        "rojo=",  # an empty value
        "rojo=1\n",  # a control character
        "rojo\n=1",
        "rojo=a=b",
        ",".join(f"k{i}=v" for i in range(33)),  # more than 32 members
        "rojo=" + "a" * MAX_TRACESTATE_CHARS,  # too long to pass on
        7,
    ],
)
def test_a_tracestate_not_in_w3c_form_is_dropped_and_the_traceparent_kept(tracestate: object) -> None:
    context = parse(TRACEPARENT_EXAMPLE, tracestate)
    assert context.traceparent == TRACEPARENT_EXAMPLE
    assert context.tracestate is None
    assert TRACESTATE not in context.attributes()


def test_a_tracestate_with_multi_tenant_keys_and_empty_members_is_kept() -> None:
    state = "fw529a3039@dt=FW4;0;0;0;0;0;0;0, ,congo=t61rcWkgMzE"
    assert parse(TRACEPARENT_EXAMPLE, state).tracestate == state


def test_a_carrier_gives_its_context_none_or_why_it_has_none() -> None:
    assert received({}) == (None, None)
    assert received({TRACESTATE: "rojo=1"}) == (None, None)  # a tracestate alone is nothing
    carried, problem = received({TRACEPARENT: TRACEPARENT_EXAMPLE})
    assert carried is not None
    assert carried.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert problem is None
    carried, problem = received({TRACEPARENT: "00-nonsense", TRACESTATE: "rojo=1"})
    assert carried is None
    assert problem is not None
    assert "55" in problem


@pytest.mark.parametrize("value", ["0" * 32, "4BF92F3577B34DA6A3CE929D0E0E4736", "4bf9", None, 7])
def test_only_a_trace_id_as_written_here_is_one(value: object) -> None:
    assert not is_trace_id(value)
