"""Answers of the Compute API kept a while per key: a wave drains many VMs of one group, and each
would otherwise read the same group's configuration again."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Answer = TypeVar("Answer")


class Kept(Generic[Answer]):
    """Each key's answer, read at its first question and again once `ttl` seconds (of `clock`) passed.
    A read that raises keeps nothing: the next question reads again."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._clock = clock
        self._answers: dict[Hashable, tuple[float, Answer]] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, read: Callable[[], Answer]) -> Answer:
        now = self._clock()
        with self._lock:
            kept = self._answers.get(key)
            if kept is not None and now - kept[0] < self._ttl:
                return kept[1]
        # Read outside the lock: two first questions at once both read, and the later answer stays.
        answer = read()
        with self._lock:
            self._answers[key] = (now, answer)
        return answer
