"""A drain through the agent's /readyz is out for the load balancer only once its probe saw the VM
unready (docs/policy.md#probe-aware-drains): the approval's drain period starts then. A drain that
edits a pool is out at once.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from functions.core.balancers import CompositeBalancer, ReadinessBalancer
from functions.core.policy import Policy
from functions.core.ports import LoadBalancer
from functions.core.process import Deps, process
from functions.local_app.balancer import LocalPool
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.kit import FakeClock, RecordingSender
from wire.commands import CommandType
from wire.envelope import encode, envelope_for_event
from wire.identity import ReporterName
from wire.model import EventKind, EventSource, EventStatus

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
POLICY = replace(Policy(), drain_period_seconds=60, readiness_probe_seconds=20)


def reboot() -> bytes:
    event = azure_event(
        kind=EventKind.REBOOT,
        status=EventStatus.SCHEDULED,
        event_id="E-PROBE",
        reporter="web-0",
        resources=("web-0",),
        duration_seconds=-1,
        event_source=EventSource.PLATFORM,
        not_before=NOW + timedelta(minutes=15),
    )
    return encode(envelope_for_event(event, NOW))


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
