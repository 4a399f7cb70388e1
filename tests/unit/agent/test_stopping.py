"""The agent's stop: set by a signal handler while the main thread waits on it, or by any thread."""

from __future__ import annotations

import signal
import sys
import threading

import pytest

from agent.stopping import StopSignal

JOIN = 10.0


@pytest.mark.skipif(sys.platform == "win32", reason="SIGALRM is POSIX")
def test_a_signal_handler_sets_it_while_the_main_thread_waits_on_it() -> None:
    stop = StopSignal()
    previous = signal.signal(signal.SIGALRM, lambda *_: stop.set())
    try:
        # WHEN a signal arrives while the main thread blocks in wait() (the agent's main thread does)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        # THEN the handler runs and the wait returns True (a threading.Event here may deadlock)
        assert stop.wait(JOIN) is True
        assert stop.is_set()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        stop.close()


def test_setting_it_wakes_every_waiter_and_later_waits_return_at_once() -> None:
    stop = StopSignal()
    woken: list[bool] = []
    waiters = [threading.Thread(target=lambda: woken.append(stop.wait())) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    stop.set()
    for waiter in waiters:
        waiter.join(JOIN)
    assert woken == [True, True, True]
    assert stop.wait(0) is True
    assert stop.wait() is True
    stop.set()  # setting it again is harmless
    stop.close()


def test_a_wait_that_times_out_says_so() -> None:
    stop = StopSignal()
    assert stop.wait(0.01) is False
    assert not stop.is_set()
    stop.close()


def test_a_closed_signal_does_not_hang_a_waiter() -> None:
    stop = StopSignal()
    stop.close()
    assert stop.wait(JOIN) is False
