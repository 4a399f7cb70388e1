"""The first values of proof bindings this process found kept in the store (`wire.identity.ProofBinding`).

The store keeps a binding's first value for good, so a value once found there is the first for as
long as this process lives: a message bringing it again needs no request. A message bringing
another value is always asked of the store (and refused there). Bounded: the oldest entries go
first; an entry gone costs one read the next time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

MOST_BINDINGS = 4096  # documents of agents active lately; about 150 bytes each


class ProofsSeen:
    def __init__(self, most: int = MOST_BINDINGS) -> None:
        self._most = most
        self._first: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def is_first(self, key: str, value: bytes) -> bool:
        """Whether `value` is already known to be the first value of `key`."""
        with self._lock:
            known = self._first.get(key)
            if known is not None:
                self._first.move_to_end(key)
            return known == value

    def found_first(self, key: str, value: bytes) -> None:
        """The store said `value` is the first value of `key`."""
        with self._lock:
            self._first[key] = value
            self._first.move_to_end(key)
            while len(self._first) > self._most:
                self._first.popitem(last=False)
