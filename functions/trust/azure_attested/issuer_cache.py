"""What fetching each caIssuers URL gave, remembered for a while: the certificates it served, or
why it failed.

A function instance verifies many documents signed under the same few intermediates; fetching each
once saves a round trip per message. Failures are remembered too: otherwise every forged document
naming an unreachable or missing URL would cost a fetch, so a storm of them would cost as many.
One `IssuerMemory` is shared by the process (`shared_issuer_memory`); tests give their own, with
their own clock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

from cryptography import x509

ISSUER_CACHE_SIZE = 64  # URLs remembered; the oldest is forgotten first
FETCH_RETRY_AFTER = 300.0  # seconds before a URL whose fetch failed is asked again
ANSWER_KEPT_FOR = 24 * 3600.0  # seconds a URL's certificates are used without asking again


@dataclass(frozen=True)
class Recalled:
    """What a URL gave when it was last asked: its certificates, or why it failed."""

    certificates: tuple[x509.Certificate, ...]
    failure: str | None  # None: it answered with `certificates`
    retryable: bool  # the failure may pass (unreachable, 5xx), or it is an answer (4xx, no certificate)
    asked_at: float


class IssuerMemory:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        size: int = ISSUER_CACHE_SIZE,
        retry_after: float = FETCH_RETRY_AFTER,
        keep_for: float = ANSWER_KEPT_FOR,
    ) -> None:
        self._clock = clock
        self._size = size
        self._retry_after = retry_after
        self._keep_for = keep_for
        self._entries: OrderedDict[str, Recalled] = OrderedDict()
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._clock()

    def recall(self, url: str) -> Recalled | None:
        """What `url` gave, unless that was longer ago than a failure or an answer is kept."""
        with self._lock:
            entry = self._entries.get(url)
            if entry is None:
                return None
            kept = self._retry_after if entry.failure is not None else self._keep_for
            if self._clock() - entry.asked_at >= kept:
                del self._entries[url]
                return None
            self._entries.move_to_end(url)
            return entry

    def remember_answer(self, url: str, certificates: Sequence[x509.Certificate]) -> None:
        self._store(url, Recalled(tuple(certificates), None, False, self._clock()))

    def remember_failure(self, url: str, failure: str, *, retryable: bool) -> None:
        self._store(url, Recalled((), failure, retryable, self._clock()))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def _store(self, url: str, entry: Recalled) -> None:
        with self._lock:
            self._entries[url] = entry
            self._entries.move_to_end(url)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)


_shared = IssuerMemory()


def shared_issuer_memory() -> IssuerMemory:
    """The process's memory of caIssuers URLs (what verifiers use unless given their own)."""
    return _shared


def clear_issuer_cache() -> None:
    """Forget what every URL gave (its issuing CA is fetched again when needed)."""
    _shared.clear()
