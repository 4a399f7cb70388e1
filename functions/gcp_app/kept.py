"""Answers of the Compute API kept a while per key: a wave drains many VMs of one group, and each
would otherwise read the same group's configuration again."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from functools import partial
from typing import Generic, TypeVar

from functions.trust.gce_instances import GceInstance

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


class PerGroup(Generic[Answer]):
    """An answer about each managed instance group that made an instance of a VM's name, read by
    `read(group URL)` and kept `ttl` seconds a group; `created_by` names an instance's group (None: no
    group made it)."""

    def __init__(
        self,
        instances_named: Callable[[str], Sequence[GceInstance]],
        created_by: Callable[[GceInstance], str | None],
        read: Callable[[str], Answer],
        *,
        ttl: float,
        clock: Callable[[], float],
    ) -> None:
        self._instances_named = instances_named
        self._created_by = created_by
        self._read = read
        self._kept: Kept[Answer] = Kept(ttl, clock)

    def of(self, vm: str) -> Iterator[tuple[str, Answer]]:
        """(group URL, its answer) for each instance named `vm` that a managed group made."""
        for instance in self._instances_named(vm):
            group = self._created_by(instance)
            if group is not None:
                yield group, self._kept.get(group, partial(self._read, group))
