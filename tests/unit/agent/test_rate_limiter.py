"""RateLimiter: at most N calls in any window of one second (or longer), bursts allowed within it."""

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


def test_a_longer_window_keeps_the_calls_past_the_limit_that_much_further_apart() -> None:
    clock = FakeClock(monotonic=1000.0)
    limiter = RateLimiter(5, monotonic=clock.monotonic, sleep=clock.sleep, window=1.1)
    # four polls a second and a proof: the sixth call goes 1.1 s after the first, not 1.0
    assert calls_at(limiter, clock, [0.0, 0.1, 0.25, 0.5, 0.75, 1.0]) == [0.0, 0.1, 0.25, 0.5, 0.75, 1.1]


def test_a_window_shorter_than_a_second_is_refused() -> None:
    with pytest.raises(ValueError, match="at least a second"):
        RateLimiter(5, window=0.9)


def test_the_agents_imds_limiter_keeps_a_margin_on_the_second_imds_counts() -> None:
    from agent.sources.azure.client import IMDS_WINDOW_SECONDS, AzureImdsClient

    assert IMDS_WINDOW_SECONDS == 1.1
    client = AzureImdsClient.for_base_url("http://169.254.169.254", per_second=5)
    limiter = client._http._limiter  # the wiring is the point
    assert limiter is not None
    assert limiter._window == IMDS_WINDOW_SECONDS
