"""A drain through the agent's /readyz is out for the load balancer only once its probe saw the VM
unready (docs/policy.md#probe-aware-drains): the approval's drain period starts then. A drain that
edits a pool is out at once.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

import pytest

from functions.core.balancers import CompositeBalancer, ReadinessBalancer
from functions.core.keys import event_key
from functions.core.policy import Policy
from functions.core.ports import JsonObject, LoadBalancer
from functions.core.probes import ProbeReader
from functions.core.process import Deps, process
from functions.local_app.balancer import LocalPool
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.kit import FakeClock, RecordingSender
from wire.commands import CommandType
from wire.envelope import encode, envelope_for_event
from wire.errors import PermanentError, RetryableError
from wire.identity import ReporterName
from wire.model import EventKind, EventSource, EventStatus

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
POLICY = replace(Policy(), drain_period_seconds=60, readiness_probe_seconds=20)


EVENT = azure_event(
    kind=EventKind.REBOOT,
    status=EventStatus.SCHEDULED,
    event_id="E-PROBE",
    reporter="web-0",
    resources=("web-0",),
    duration_seconds=-1,
    event_source=EventSource.PLATFORM,
    not_before=NOW + timedelta(minutes=15),
)


def reboot() -> bytes:
    return encode(envelope_for_event(EVENT, NOW))


def approval_after(balancer: LoadBalancer, sent: RecordingSender, policy: Policy = POLICY) -> float:
    store = SqliteStore(":memory:")
    try:
        deps = Deps(store, balancer, sent, store, policy, verifier=ReporterName(), monotonic=FakeClock().monotonic)
        process(reboot(), deps, NOW)
    finally:
        store.close()
    (approval,) = [command for command in sent.commands if command.type is CommandType.APPROVE]
    assert approval.execute_at is not None
    return (approval.execute_at - NOW).total_seconds()


def pool() -> LocalPool:
    made = LocalPool(":memory:")
    made.add("web", ["web-0", "web-1"])
    return made


def test_a_pool_edit_is_out_at_once_and_the_drain_period_starts_then() -> None:
    assert approval_after(pool(), RecordingSender()) == 60


@pytest.mark.parametrize("alone", [True, False], ids=["readiness", "readiness-and-pool"])
def test_a_readiness_drain_is_out_once_the_probe_saw_it(alone: bool) -> None:
    sent = RecordingSender()
    readiness = ReadinessBalancer(sent, clock=lambda: NOW)
    balancer: LoadBalancer = readiness if alone else CompositeBalancer([("pool", pool()), ("readiness", readiness)])
    # the probe's 20 s, then the 60 s drain period
    assert approval_after(balancer, sent) == 80


def test_notbefore_still_caps_a_probe_aware_approval() -> None:
    sent = RecordingSender()
    # 15 minutes of notice, less the 5 s margin: 895 s is the latest
    policy = replace(POLICY, drain_period_seconds=800, readiness_probe_seconds=200, command_ttl_seconds=1200)
    assert approval_after(ReadinessBalancer(sent, clock=lambda: NOW), sent, policy) == 895


# ---------------------------------------------------------------- the probe's time as read


@dataclass
class Drained:
    """What one drain of web-0 came to: the approval's wait (s), the memento, the drain's audit reason."""

    wait: float
    memento: JsonObject
    reason: str


def drained_with(reader: ProbeReader | None, policy: Policy = POLICY, located: JsonObject | None = None) -> Drained:
    """A drain of web-0 through /readyz with `reader`; `located`: the memento an earlier attempt (or an
    earlier version) recorded before it crashed, which the retry finishes."""
    sent = RecordingSender()
    balancer = ReadinessBalancer(sent, clock=lambda: NOW, probe_seconds=reader)
    store = SqliteStore(":memory:")
    try:
        if located is not None:
            store.record_drain(event_key(EVENT), "web-0", {"memento": located, "state": "located"})
        deps = Deps(store, balancer, sent, store, policy, verifier=ReporterName(), monotonic=FakeClock().monotonic)
        process(reboot(), deps, NOW)
        memento = store.drains(event_key(EVENT))["web-0"]["memento"]
        (drain,) = [record for record in store.query(vm="web-0") if record.action == "drain"]
    finally:
        store.close()
    (approval,) = [command for command in sent.commands if command.type is CommandType.APPROVE]
    assert approval.execute_at is not None
    assert approval.execute_at <= approval.expires_at  # an approval the agent can still run
    return Drained((approval.execute_at - NOW).total_seconds(), memento, drain.reason)


def test_the_balancers_own_time_is_read_recorded_and_counted() -> None:
    asked: list[str] = []

    def reader(vm: str) -> float:
        asked.append(vm)
        return 12.0

    drained = drained_with(reader)
    # the balancer's 12 s, then the 60 s drain period (not the policy's 20 s)
    assert drained.wait == 72
    assert asked == ["web-0"]
    assert drained.memento["probe_seconds"] == 12.0
    assert "out once the balancer's probe saw it: 12 s (read from the load balancer)" in drained.reason


@pytest.mark.parametrize("read", [None, -1, math.nan, math.inf, "12", True], ids=repr)
def test_a_balancer_that_says_nothing_usable_leaves_the_policys_value(read: object) -> None:
    drained = drained_with(lambda vm: read)  # type: ignore[arg-type,return-value]  # hostile on purpose
    assert drained.wait == 80
    assert "probe_seconds" not in drained.memento
    assert "20 s (the policy's readiness_probe_seconds)" in drained.reason


@pytest.mark.parametrize(
    ("failure", "level"),
    [
        (PermanentError("forbidden: grant Microsoft.Network/loadBalancers/read"), logging.ERROR),
        (RetryableError("the API is busy"), logging.WARNING),
        (ConnectionResetError("reset"), logging.WARNING),
    ],
    ids=["permission", "busy", "unexpected"],
)
def test_a_reader_that_fails_never_stops_the_drain(
    failure: Exception, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    def reader(vm: str) -> float:
        raise failure

    with caplog.at_level(logging.WARNING, logger="mbridge.functions"):
        drained = drained_with(reader)
    # drained all the same, on the policy's value
    assert drained.wait == 80
    assert "probe_seconds" not in drained.memento
    # and said so, a missing permission as an error to act on, with what to grant
    (said,) = [record for record in caplog.records if "could not be read" in record.getMessage()]
    assert said.levelno == level
    assert str(failure) in said.getMessage()
    assert getattr(said, "alert", None) == ("probe-unread" if level == logging.ERROR else None)


def test_a_time_longer_than_the_approval_can_wait_is_cut_to_what_it_can() -> None:
    # GIVEN a balancer that would take an hour; the approval lives 600 s and the drain period is 60 s
    drained = drained_with(lambda vm: 3600.0)
    # THEN it counts as 539 s (600 - 60, less a second), so the approval runs just inside its time to live
    assert drained.wait == 599
    assert drained.memento["probe_seconds"] == 3600.0  # what was read stays on record
    assert "539 s (read from the load balancer, cut from 3600 s to what command_ttl_seconds allows)" in drained.reason


def test_a_retry_counts_with_the_time_its_first_attempt_read() -> None:
    # GIVEN a drain located with a read 12 s before its invocation died; the balancer says 40 s now
    located: JsonObject = {"readiness": True, "drain": "d1", "probe_seconds": 12.0}
    # WHEN the retry finishes it THEN it counts the recorded 12 s and asks nothing
    drained = drained_with(lambda vm: pytest.fail("a located drain is not read again"), located=located)
    assert drained.wait == 72
    assert drained.memento == located


@pytest.mark.parametrize(
    "located",
    [
        {"readiness": True, "drain": "d1"},  # recorded by a version that did not read
        {"readiness": True, "drain": "d1", "probe_seconds": -5},
        {"readiness": True, "drain": "d1", "probe_seconds": "12"},
        {"readiness": True, "drain": "d1", "probe_seconds": None},
    ],
    ids=["earlier-version", "negative", "text", "null"],
)
def test_a_memento_without_a_usable_time_counts_the_policys(located: JsonObject) -> None:
    assert drained_with(lambda vm: 12.0, located=located).wait == 80


def test_the_time_read_is_kept_in_the_readiness_part_of_several_balancers() -> None:
    sent = RecordingSender()
    readiness = ReadinessBalancer(sent, clock=lambda: NOW, probe_seconds=lambda vm: 7.5)
    assert approval_after(CompositeBalancer([("pool", pool()), ("readiness", readiness)]), sent) == 67.5


def test_without_a_reader_nothing_is_read_or_recorded() -> None:
    memento = ReadinessBalancer(RecordingSender(), clock=lambda: NOW).locate("web-0")
    assert memento is not None
    assert set(memento) == {"readiness", "drain"}
