"""Round trips and writes of the cloud stores, counted per step of the core.

The stores are used as deployed; two small pieces of ours sit around them:

- `CountingStore` / `CountingAudit` wrap the StateStore and AuditLog ports and name the step each
  call belongs to (claim, budget, drain records, ...), per thread, so each worker counts its own
  requests under the step it is in.
- The requests themselves are counted where they leave the process: for Table Storage with
  azure-core's `raw_response_hook` (one call per HTTP response, retries included), for Firestore
  with `counting_firestore`, which puts a counting proxy in front of the client's GAPIC stub (one
  call per RPC; a commit counts its writes).

A write is a change asked of the store: for Table Storage any HTTP request but a GET (a failed
conditional write, a 409 or a 412, is a round trip and a write attempt all the same), each operation
of an entity group transaction (`$batch`, one round trip) counted; for Firestore each write of a
commit (a commit holds all of its writes in one RPC).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from functions.core.ports import (
    Admission,
    AuditLog,
    AuditRecord,
    Claim,
    Finishing,
    Glance,
    JsonObject,
    Parked,
    RecordedDrain,
    StateStore,
)

# The step of the core each port method serves.
STEPS: Mapping[str, str] = {
    "claim": "claim",
    "complete": "completion",
    "abandon": "completion",
    "reserve": "budget",
    "release": "budget",
    "glance": "first reads (end, drains, budget)",
    "record_drain": "drain records",
    "record_drain_unless": "drain records",
    "drains": "drain records",
    "forget_drain": "drain records",
    "remember": "remembered (approval, end)",
    "recall": "end check",
    "park": "parking",
    "parked": "parking",
    "unpark": "parking",
    "append": "audit lines",
}
OUTSIDE = "outside the ports"  # requests made while no port method runs (setup)


class RoundTrips:
    """Requests and writes per (envelope kind, step), thread-safe; the step is per thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self.trips: Counter[tuple[str, str]] = Counter()
        self.writes: Counter[tuple[str, str]] = Counter()
        self.envelopes: Counter[str] = Counter()

    @contextmanager
    def envelope(self, kind: str) -> Iterator[None]:
        """Count what happens in the block as part of one envelope of `kind`."""
        previous = getattr(self._local, "kind", "")
        self._local.kind = kind
        try:
            yield
        finally:
            self._local.kind = previous
            with self._lock:
                self.envelopes[kind] += 1

    @contextmanager
    def step(self, method: str) -> Iterator[None]:
        previous = getattr(self._local, "step", None)
        self._local.step = previous or STEPS[method]  # a nested call stays in the outer step
        try:
            yield
        finally:
            self._local.step = previous

    def reset(self) -> None:
        with self._lock:
            self.trips.clear()
            self.writes.clear()
            self.envelopes.clear()

    def count(self, writes: int) -> None:
        key = (getattr(self._local, "kind", ""), getattr(self._local, "step", None) or OUTSIDE)
        with self._lock:
            self.trips[key] += 1
            self.writes[key] += writes

    def total(self) -> tuple[int, int]:
        """Round trips and writes counted so far."""
        with self._lock:
            return sum(self.trips.values()), sum(self.writes.values())

    def per_envelope(self, kind: str | None = None) -> tuple[float, float]:
        """Mean round trips and writes per envelope (of `kind`, or of every kind)."""
        kinds = [kind] if kind is not None else list(self.envelopes)
        envelopes = sum(self.envelopes[k] for k in kinds) or 1
        trips = sum(n for (k, _), n in self.trips.items() if k in kinds)
        writes = sum(n for (k, _), n in self.writes.items() if k in kinds)
        return trips / envelopes, writes / envelopes

    def breakdown(self, kind: str) -> str:
        """'claim 1 (1 write), audit lines 4 (4 writes), ...' per envelope of `kind`."""
        envelopes = self.envelopes[kind] or 1
        steps = sorted({step for (k, step) in self.trips if k == kind})
        return ", ".join(
            f"{step} {self.trips[(kind, step)] / envelopes:.2g} ({self.writes[(kind, step)] / envelopes:.2g} w)"
            for step in steps
        )


class CountingStore:
    """A StateStore that names the step of every call (see `RoundTrips.step`)."""

    def __init__(self, inner: StateStore, counter: RoundTrips) -> None:
        self._inner = inner
        self._counter = counter

    def claim(self, key: str, now: datetime, lease: timedelta) -> Claim:
        with self._counter.step("claim"):
            return self._inner.claim(key, now, lease)

    def finishing(self, key: str, now: datetime, forgotten: Sequence[tuple[str, str]] = ()) -> Finishing:
        return _CountedFinishing(self._inner.finishing(key, now, forgotten), self._counter)

    def complete(self, key: str, now: datetime) -> None:
        with self._counter.step("complete"):
            self._inner.complete(key, now)

    def abandon(self, key: str, now: datetime) -> None:
        with self._counter.step("abandon"):
            self._inner.abandon(key, now)

    def reserve(
        self,
        pool: str,
        event_key: str,
        vms: Sequence[str],
        limit: int | None,
        *,
        now: datetime,
        expires_at: datetime,
        alone: bool = False,
        seen: object | None = None,
    ) -> Admission:
        with self._counter.step("reserve"):
            return self._inner.reserve(
                pool, event_key, vms, limit, now=now, expires_at=expires_at, alone=alone, seen=seen
            )

    def release(self, pool: str, event_key: str) -> None:
        with self._counter.step("release"):
            self._inner.release(pool, event_key)

    def record_drain(self, event_key: str, vm: str, memento: JsonObject) -> None:
        with self._counter.step("record_drain"):
            self._inner.record_drain(event_key, vm, memento)

    def record_drain_unless(self, event_key: str, vm: str, memento: JsonObject, ended: str) -> bytes | None:
        with self._counter.step("record_drain_unless"):
            return self._inner.record_drain_unless(event_key, vm, memento, ended)

    def glance(
        self, recall: Sequence[str], event_key: str = "", vms: Sequence[str] = (), pools: Sequence[str] = ()
    ) -> Glance:
        with self._counter.step("glance"):
            return self._inner.glance(recall, event_key, vms, pools)

    def drains(self, event_key: str) -> Mapping[str, JsonObject]:
        with self._counter.step("drains"):
            return self._inner.drains(event_key)

    def forget_drain(self, event_key: str, vm: str) -> None:
        with self._counter.step("forget_drain"):
            self._inner.forget_drain(event_key, vm)

    def all_drains(self) -> Sequence[RecordedDrain]:
        with self._counter.step("all_drains"):
            return self._inner.all_drains()

    def remember(self, key: str, value: bytes) -> bytes:
        with self._counter.step("remember"):
            return self._inner.remember(key, value)

    def recall(self, key: str) -> bytes | None:
        with self._counter.step("recall"):
            return self._inner.recall(key)

    def park(self, pool: str, event_key: str, envelope: bytes, now: datetime) -> None:
        with self._counter.step("park"):
            self._inner.park(pool, event_key, envelope, now)

    def parked(self, pool: str) -> Sequence[Parked]:
        with self._counter.step("parked"):
            return self._inner.parked(pool)

    def unpark(self, pool: str, event_key: str) -> None:
        with self._counter.step("unpark"):
            self._inner.unpark(pool, event_key)


class _CountedFinishing:
    """A store's `Finishing` whose own writes count as the step `completion`; one an audit log folds
    into its commit (`writes`, Firestore) counts with the audit lines."""

    def __init__(self, inner: Finishing, counter: RoundTrips) -> None:
        self._inner = inner
        self._counter = counter

    def write(self) -> None:
        with self._counter.step("complete"):
            self._inner.write()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CountingAudit:
    """An AuditLog whose appends count as the step `audit lines`."""

    def __init__(self, inner: AuditLog, counter: RoundTrips) -> None:
        self._inner = inner
        self._counter = counter

    def append(self, record: AuditRecord) -> None:
        with self._counter.step("append"):
            self._inner.append(record)

    def append_all(self, records: Sequence[AuditRecord], then: Finishing | None = None) -> None:
        with self._counter.step("append"):
            self._inner.append_all(records, then)

    def query(self, *, vm: str | None = None, event_id: str | None = None) -> Sequence[AuditRecord]:
        return self._inner.query(vm=vm, event_id=event_id)


def table_hook(counter: RoundTrips) -> Any:
    """azure-core's `raw_response_hook`: one call per HTTP response of the client it is given to;
    an entity group transaction (`$batch`) counts each of its operations as a write."""

    def hook(response: Any) -> None:
        request = response.http_request
        counter.count(0 if request.method == "GET" else _batch_operations(request) or 1)

    return hook


def _batch_operations(request: Any) -> int:
    """The operations of a `$batch` request (each is one `application/http` part of its body), else 0."""
    body = request.body
    if not request.url.endswith("/$batch") or not isinstance(body, bytes):
        return 0
    return body.count(b"Content-Type: application/http")


class _CountingStub:
    """In front of Firestore's GAPIC client: counts each RPC, and each write of a commit."""

    def __init__(self, inner: Any, counter: RoundTrips) -> None:
        self._inner = inner
        self._counter = counter

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name.startswith("_") or not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self._counter.count(_commit_writes(kwargs.get("request")) if name == "commit" else 0)
            return attribute(*args, **kwargs)

        return call


def _commit_writes(request: Any) -> int:
    writes = request.get("writes", []) if isinstance(request, dict) else getattr(request, "writes", [])
    return len(writes)


def counting_firestore(client: Any, counter: RoundTrips) -> Any:
    """`client` (a firestore.Client) with its RPCs counted; returns it."""
    # The library reaches its GAPIC client through this attribute; the proxy stands in for it.
    client._firestore_api_internal = _CountingStub(client._firestore_api, counter)
    return client
