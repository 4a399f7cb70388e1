"""Metadata-service misbehaviour on demand, per VM: what a robust client has to survive.

Faults apply to metadata paths only, never to /_sim/. For each request the order is: a dropped
connection (nothing else is consumed), the rate limit, an error burst, a refused proof of identity,
then the delays (first-call delay and added latency); a malformed body replaces the body of a
document-carrying 200 answer.

The `central_*` fields are the central feed's (store/central_feed.py: Azure's Event Grid events, GCE's
system-event log entries): simulator-wide, not a VM's, since the control plane delivers to the
subscription or project, not to a VM. They arrive through the same POST so a scenario's `fault`
step can set them too.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from http import HTTPStatus

from simulator.clock import Clock
from simulator.store import Cloud, FieldError, Response, SimLog

RATE_LIMIT_REQUESTS = 5  # IMDS: at most 5 requests per second per VM
RATE_LIMIT_WINDOW = 1.0  # real seconds


@dataclass(frozen=True)
class ErrorBurst:
    status: int
    count: int


@dataclass(frozen=True)
class FaultChange:
    """A POST /_sim/faults body (also a scenario `fault` step); only the fields given change."""

    vm: str | None = None  # None: every VM
    rate_limit: bool | None = None
    error_burst: ErrorBurst | None = None
    latency_ms: int | None = None
    first_call_delay: float | None = None  # documented seconds
    malformed: int | None = None
    drop: int | None = None
    refuse_proofs: int | None = None  # a 4xx status; 0 lifts it
    central_delay: float | None = None  # real seconds before an emission of the central feed is readable
    central_duplicates: int | None = None  # every Nth emission delivered twice; 0: never
    central_off: bool | None = None  # no emissions recorded while true

    @property
    def touches_vms(self) -> bool:
        vm_fields = (
            self.rate_limit,
            self.error_burst,
            self.latency_ms,
            self.first_call_delay,
            self.malformed,
            self.drop,
            self.refuse_proofs,
        )
        return any(value is not None for value in vm_fields)

    @property
    def touches_central(self) -> bool:
        return any(value is not None for value in (self.central_delay, self.central_duplicates, self.central_off))


@dataclass(frozen=True)
class VmFaults:
    rate_limit: bool
    error_status: int = 503
    error_count: int = 0
    latency_ms: int = 0
    first_call_delay: float = 0.0  # armed for the next first-call candidate; documented seconds
    malformed: int = 0
    drop: int = 0
    # The status the proof endpoint (Azure attested document, GCE identity token) answers, 0 for none:
    # Microsoft's Scheduled Events mock server answers 404 there, and a metadata service can refuse it.
    refuse_proofs: int = 0


@dataclass(frozen=True)
class Admission:
    """What the faults decided for one request before it reaches the API."""

    drop: bool = False
    delay: float = 0.0  # real seconds to wait before answering
    reject: Response | None = None
    reason: str = ""


_CENTRAL_FIELDS = {"central_delay", "central_duplicates", "central_off"}
_FIELDS = {
    "vm",
    "rate_limit",
    "error_burst",
    "latency_ms",
    "first_call_delay",
    "malformed",
    "drop",
    "refuse_proofs",
    *_CENTRAL_FIELDS,
}


def parse_fault_change(body: Mapping[str, object]) -> FaultChange:
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise FieldError(unknown[0], f"unknown field; allowed: {', '.join(sorted(_FIELDS))}")
    if not set(body) - {"vm"}:
        raise FieldError("(body)", f"give at least one fault: {', '.join(sorted(_FIELDS - {'vm'}))}")
    vm = body.get("vm")
    if vm is not None and (not isinstance(vm, str) or not vm):
        raise FieldError("vm", "must be a VM name ('$0' means the first VM); leave it out for every VM")
    if vm is not None and _CENTRAL_FIELDS & set(body):
        raise FieldError("vm", "the central_* faults are the whole simulator's feed, not a VM's; leave vm out")
    rate_limit = body.get("rate_limit")
    if rate_limit is not None and not isinstance(rate_limit, bool):
        raise FieldError("rate_limit", "must be true or false")
    burst = None
    raw_burst = body.get("error_burst")
    if raw_burst is not None:
        if not isinstance(raw_burst, dict) or set(raw_burst) - {"status", "count"}:
            raise FieldError("error_burst", 'must be {"status": <400..599>, "count": <n>}')
        status = _count(raw_burst, "status", "error_burst.status", default=503)
        if not 400 <= status <= 599:
            raise FieldError("error_burst.status", "must be an HTTP error status between 400 and 599")
        burst = ErrorBurst(status=status, count=_count(raw_burst, "count", "error_burst.count", default=1))
    delay = body.get("first_call_delay")
    if delay is not None and (isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0):
        raise FieldError("first_call_delay", "must be documented seconds >= 0 (IMDS documents up to 120)")
    refuse_proofs = _count(body, "refuse_proofs", "refuse_proofs") if "refuse_proofs" in body else None
    if refuse_proofs and not 400 <= refuse_proofs <= 499:
        # 5xx and 429 are transient answers: error_burst gives those
        raise FieldError("refuse_proofs", "must be a client error status between 400 and 499, or 0 to answer again")
    central_delay = body.get("central_delay")
    if central_delay is not None and (
        isinstance(central_delay, bool) or not isinstance(central_delay, (int, float)) or not 0 <= central_delay < 1e9
    ):
        raise FieldError("central_delay", "must be real seconds >= 0 before an emission can be read")
    central_off = body.get("central_off")
    if central_off is not None and not isinstance(central_off, bool):
        raise FieldError("central_off", "must be true or false")
    return FaultChange(
        vm=vm,
        rate_limit=rate_limit,
        error_burst=burst,
        latency_ms=_count(body, "latency_ms", "latency_ms") if "latency_ms" in body else None,
        first_call_delay=None if delay is None else float(delay),
        malformed=_count(body, "malformed", "malformed") if "malformed" in body else None,
        drop=_count(body, "drop", "drop") if "drop" in body else None,
        refuse_proofs=refuse_proofs,
        central_delay=None if central_delay is None else float(central_delay),
        central_duplicates=(
            _count(body, "central_duplicates", "central_duplicates") if "central_duplicates" in body else None
        ),
        central_off=central_off,
    )


def _count(body: Mapping[str, object], key: str, name: str, default: int = 0) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FieldError(name, "must be a whole number >= 0")
    return value


class FaultBook:
    """Armed faults and the rate limiter's recent requests, per VM."""

    def __init__(
        self, clock: Clock, cond: threading.Condition, log: SimLog, cloud: Cloud, vm_names: Sequence[str]
    ) -> None:
        self._clock = clock
        self._cond = cond
        self._log = log
        self._cloud = cloud
        # IMDS throttles by default; the GCE metadata server documents no such limit.
        self._faults = {vm: VmFaults(rate_limit=cloud is Cloud.AZURE) for vm in vm_names}
        self._recent: dict[str, deque[float]] = {vm: deque() for vm in vm_names}

    def apply(self, change: FaultChange, vms: Sequence[str], at: float | None = None) -> None:
        with self._cond:
            for vm in vms:
                faults = self._faults[vm]
                if change.rate_limit is not None:
                    faults = replace(faults, rate_limit=change.rate_limit)
                if change.error_burst is not None:
                    faults = replace(
                        faults, error_status=change.error_burst.status, error_count=change.error_burst.count
                    )
                if change.latency_ms is not None:
                    faults = replace(faults, latency_ms=change.latency_ms)
                if change.first_call_delay is not None:
                    faults = replace(faults, first_call_delay=change.first_call_delay)
                if change.malformed is not None:
                    faults = replace(faults, malformed=change.malformed)
                if change.drop is not None:
                    faults = replace(faults, drop=change.drop)
                if change.refuse_proofs is not None:
                    faults = replace(faults, refuse_proofs=change.refuse_proofs)
                self._faults[vm] = faults
                self._log.add(f"faults now {_describe(faults)}", vm=vm, at=at)

    def snapshot(self) -> dict[str, dict[str, object]]:
        with self._cond:
            return {
                vm: {
                    "rate_limit": f.rate_limit,
                    "error_burst": {"status": f.error_status, "count": f.error_count},
                    "latency_ms": f.latency_ms,
                    "first_call_delay": f.first_call_delay,
                    "malformed": f.malformed,
                    "drop": f.drop,
                    "refuse_proofs": f.refuse_proofs,
                }
                for vm, f in self._faults.items()
            }

    def admit(self, vm: str, first_call_candidate: bool, proof_request: bool = False) -> Admission:
        """Decide drop / reject / delay for one metadata request of `vm`, consuming one-shot faults.
        `proof_request`: the request asks for a proof of identity (attested document, identity token)."""
        with self._cond:
            faults = self._faults[vm]
            if faults.drop > 0:
                self._faults[vm] = replace(faults, drop=faults.drop - 1)
                return Admission(drop=True, reason="dropped")
            delay = faults.latency_ms / 1000.0
            if first_call_candidate and faults.first_call_delay > 0:
                delay += self._clock.real_delay(faults.first_call_delay)
                faults = replace(faults, first_call_delay=0.0)
                self._faults[vm] = faults
            if faults.rate_limit and self._over_rate(vm):
                return Admission(delay=delay, reject=self._too_many(), reason="rate-limited")
            if faults.error_count > 0:
                self._faults[vm] = replace(faults, error_count=faults.error_count - 1)
                return Admission(delay=delay, reject=self._error(faults.error_status), reason="error-burst")
            if proof_request and faults.refuse_proofs:
                return Admission(delay=delay, reject=self._error(faults.refuse_proofs), reason="proof-refused")
            return Admission(delay=delay)

    def take_malformed(self, vm: str) -> bool:
        """True (and one fewer left) when this VM's next document answer is to be broken."""
        with self._cond:
            faults = self._faults[vm]
            if faults.malformed <= 0:
                return False
            self._faults[vm] = replace(faults, malformed=faults.malformed - 1)
            return True

    def _over_rate(self, vm: str) -> bool:
        # Sliding window over the requests admitted in the last real second; refused ones don't count,
        # so a client that backs off gets through again after at most one second.
        now = self._clock.real_now()
        recent = self._recent[vm]
        while recent and recent[0] <= now - RATE_LIMIT_WINDOW:
            recent.popleft()
        if len(recent) >= RATE_LIMIT_REQUESTS:
            return True
        recent.append(now)
        return False

    def _headers(self) -> tuple[tuple[str, str], ...]:
        return (("Metadata-Flavor", "Google"),) if self._cloud is Cloud.GCE else ()

    def _too_many(self) -> Response:
        body = b'{"error": "Too many requests. IMDS allows 5 requests per second per VM; back off and retry."}'
        if self._cloud is Cloud.GCE:
            return Response(status=429, body=b"Too Many Requests\n", content_type="text/plain", headers=self._headers())
        return Response(status=429, body=body)

    def _error(self, status: int) -> Response:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Error"
        return Response(
            status=status,
            body=f"{status} {phrase}\n".encode(),
            content_type="text/plain; charset=utf-8",
            headers=self._headers(),
        )


def _describe(faults: VmFaults) -> str:
    parts = [f"rate_limit={'on' if faults.rate_limit else 'off'}"]
    if faults.error_count:
        parts.append(f"error_burst={faults.error_count}x{faults.error_status}")
    if faults.latency_ms:
        parts.append(f"latency={faults.latency_ms}ms")
    if faults.first_call_delay:
        parts.append(f"first_call_delay={faults.first_call_delay:g}s")
    if faults.malformed:
        parts.append(f"malformed={faults.malformed}")
    if faults.drop:
        parts.append(f"drop={faults.drop}")
    if faults.refuse_proofs:
        parts.append(f"refuse_proofs={faults.refuse_proofs}")
    return ", ".join(parts)
