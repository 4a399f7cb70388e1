"""A failed Service Bus message waits before it goes back (functions/azure_app/redelivery.py):
Service Bus alone redelivers at once, and ten failures would dead-letter it within seconds.
"""

from __future__ import annotations

import pytest

from functions.azure_app.redelivery import MOST_DELAY_SECONDS, backing_off, redelivery_delay
from wire.errors import PermanentError, RetryableError


def test_the_delay_doubles_from_two_seconds_to_a_minute_and_the_ten_deliveries_span_minutes() -> None:
    delays = [redelivery_delay(count) for count in range(1, 11)]
    assert delays == [2, 4, 8, 16, 32, 60, 60, 60, 60, 60]
    # a role assignment that takes a few minutes to propagate is given them before the dead letter
    assert sum(delays[:-1]) >= 4 * 60
    assert redelivery_delay(None) == 2  # no count given: the first delivery
    assert redelivery_delay(10**6) == MOST_DELAY_SECONDS


@pytest.mark.parametrize("error", [RetryableError("throttled"), PermanentError("403 while the role propagates")])
def test_a_failure_waits_then_raises_so_the_message_goes_back(error: Exception) -> None:
    waited: list[float] = []

    def fail() -> None:
        raise error

    with pytest.raises(type(error)):
        backing_off(fail, delivery_count=3, sleep=waited.append)
    assert waited == [8]


def test_a_success_and_a_bug_do_not_wait() -> None:
    waited: list[float] = []
    assert backing_off(lambda: "done", delivery_count=5, sleep=waited.append) == "done"

    def bug() -> None:
        raise KeyError("not a failure of the product's making")

    with pytest.raises(KeyError):
        backing_off(bug, delivery_count=5, sleep=waited.append)
    assert waited == []
