"""RateLimiter: at most N calls in any window of one second, bursts allowed within it."""

from __future__ import annotations

import pytest

from agent.timing import RateLimiter
from tests.kit import FakeClock


def calls_at(limiter: RateLimiter, clock: FakeClock, at: list[float]) -> list[float]:
    """Ask at each moment (relative); return when each call was let through."""
    granted = []
    for moment in at:
        clock.advance(max(0.0, 1000.0 + moment - clock.monotonic()))
        limiter.acquire()
        granted.append(round(clock.monotonic() - 1000.0, 6))
    return granted


def test_a_burst_up_to_the_limit_goes_out_at_once() -> None:
    clock = FakeClock(monotonic=1000.0)
    limiter = RateLimiter(4, monotonic=clock.monotonic, sleep=clock.sleep)
    # a poll, then an approval's re-read and POST right after it: no waiting
    assert calls_at(limiter, clock, [0.0, 0.01, 0.02]) == [0.0, 0.01, 0.02]


def test_the_call_past_the_limit_waits_until_the_window_has_room() -> None:
    clock = FakeClock(monotonic=1000.0)
    limiter = RateLimiter(4, monotonic=clock.monotonic, sleep=clock.sleep)
    assert calls_at(limiter, clock, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]) == [0.0, 0.1, 0.2, 0.3, 1.0, 1.1]


def test_no_window_of_a_second_holds_more_than_the_limit_under_a_flood() -> None:
    clock = FakeClock(monotonic=1000.0)
    limiter = RateLimiter(4, monotonic=clock.monotonic, sleep=clock.sleep)
    granted = calls_at(limiter, clock, [0.0] * 40)
    for index in range(len(granted) - 4):
        assert granted[index + 4] - granted[index] >= 1.0 - 1e-9
    assert granted[-1] == pytest.approx(9.0)


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="positive whole number"):
        RateLimiter(0)


def test_fast_polling_leaves_a_slot_a_second_for_approvals_and_proofs() -> None:
    from agent.sources.azure.client import requests_per_second

    assert requests_per_second(1.0) == 4  # the default keeps a margin under IMDS's 5 for other users
    assert requests_per_second(0.5) == 4  # two polls a second leave room in 4
    assert requests_per_second(0.25) == 5  # four polls a second: the fifth is the agent's other requests'
