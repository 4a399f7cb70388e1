"""When the agent holds its command path: while something of its own is open, and for the linger after."""

from __future__ import annotations

import pytest

from agent.engagement import DEFAULT_LINGER_SECONDS, Engagement
from tests.kit.clock import FakeClock

NOTHING = {"open_events": False, "drained": False, "work_pending": False}


def test_a_started_agent_is_engaged_for_the_linger_then_rests() -> None:
    clock = FakeClock()
    engagement = Engagement(clock.monotonic, linger_seconds=600)
    clock.advance(599)
    assert engagement.engaged(**NOTHING)
    assert engagement.seconds_left() == pytest.approx(1.0)
    clock.advance(1)
    assert not engagement.engaged(**NOTHING)
    assert engagement.seconds_left() == 0.0


@pytest.mark.parametrize("holding", ["open_events", "drained", "work_pending"])
def test_each_thing_that_may_bring_commands_holds_the_path_and_restarts_the_linger(holding: str) -> None:
    clock = FakeClock()
    engagement = Engagement(clock.monotonic, linger_seconds=600)
    clock.advance(10_000)
    assert not engagement.engaged(**NOTHING)
    assert engagement.engaged(**{**NOTHING, holding: True})
    # the restore that answers an event's end comes after the event is gone from the document
    clock.advance(599)
    assert engagement.engaged(**NOTHING)
    clock.advance(1)
    assert not engagement.engaged(**NOTHING)


def test_no_linger_rests_as_soon_as_nothing_is_open() -> None:
    clock = FakeClock()
    engagement = Engagement(clock.monotonic, linger_seconds=0)
    assert not engagement.engaged(**NOTHING)
    assert engagement.engaged(**{**NOTHING, "open_events": True})
    assert not engagement.engaged(**NOTHING)


def test_the_default_linger_is_the_commands_lifetime_and_a_negative_one_is_refused() -> None:
    assert DEFAULT_LINGER_SECONDS == 600.0
    with pytest.raises(ValueError, match="0 seconds or more"):
        Engagement(FakeClock().monotonic, linger_seconds=-1)
