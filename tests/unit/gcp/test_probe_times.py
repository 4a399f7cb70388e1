"""The probes' times on Google Cloud (functions/gcp_app/probe_times.py): a VM made by a managed group
counts with the slowest health check of the group's backend services that probes its readiness, and
with the policy's value when none does or one cannot be read. The services come from an in-memory
`BackendReader`; the Compute API's reads of them are tested against the API's stand-in
(tests/contract/gcp/test_probe_times_reads.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from functions.core.balancers import ReadinessBalancer
from functions.core.policy import Policy
from functions.gcp_app import wiring
from functions.gcp_app.autohealer import HealthCheckTarget
from functions.gcp_app.probe_times import TTL_SECONDS, GroupProbeTimes, ServiceCheck
from functions.trust.gce_instances import GceInstance
from tests.kit import FakeClock, RecordingSender
from tests.unit.gcp.test_entry import NOW, FakePublisher, offline_clients, settings_for

GROUP = "projects/shop-prod/zones/europe-west1-b/instanceGroupManagers/web"
READYZ = HealthCheckTarget("agent-readyz", "HTTP", "/readyz", 9797)


def check(seconds: float | None, target: HealthCheckTarget = READYZ, service: str = "web") -> ServiceCheck:
    return ServiceCheck(service, target, seconds)


@dataclass
class Backends:
    """The `BackendReader` of a project: which group made each instance, the checks of each group's services."""

    made_by: dict[str, str] = field(default_factory=dict)
    checks: dict[str, list[ServiceCheck]] = field(default_factory=dict)
    reads: int = 0

    def created_by(self, instance: GceInstance) -> str | None:
        return self.made_by.get(instance.name)

    def service_checks(self, group_url: str) -> Sequence[ServiceCheck]:
        self.reads += 1
        return self.checks.get(group_url, [])


def named(vm: str) -> list[GceInstance]:
    return [GceInstance("shop-prod", "europe-west1-b", vm, "1001")]


def seconds_of(*checks: ServiceCheck) -> float | None:
    return GroupProbeTimes(Backends({"web-0": GROUP}, {GROUP: list(checks)}), named).seconds("web-0")


@pytest.mark.parametrize(
    ("checks", "seconds"),
    [
        ([check(10.0)], 10.0),
        ([check(10.0), check(30.0, service="internal")], 30.0),  # the slowest balancer
        ([check(10.0), check(300.0, HealthCheckTarget("tcp", "TCP", None, None))], 10.0),  # TCP sees no drain
        ([check(10.0), check(60.0, HealthCheckTarget("app", "HTTP", "/health", 8080))], 10.0),  # nor the app's
        ([check(10.0), check(60.0, HealthCheckTarget("app", "HTTP", "/readyz", 8080))], 10.0),  # nor its /readyz
        ([check(20.0, HealthCheckTarget("named", "HTTP", "/readyz", None))], 20.0),  # a named port may be the agent's
        ([check(10.0, HealthCheckTarget("q", "HTTP", "/readyz?full=1", 9797))], 10.0),  # the query is not the path
        ([], None),  # no backend service sends to the group
        ([check(300.0, HealthCheckTarget("tcp", "TCP", None, None))], None),
        ([check(10.0), check(None)], None),  # a readiness check without its interval or threshold
        ([check(10.0), check(None, HealthCheckTarget("legacy", "UNKNOWN", None, None))], None),  # a legacy check
    ],
    ids=[
        "one",
        "slowest",
        "tcp",
        "application-path",
        "application-port",
        "named-port",
        "query",
        "no-service",
        "no-readiness-check",
        "not-read",
        "legacy",
    ],
)
def test_a_vm_counts_with_the_slowest_check_of_its_readiness(checks: list[ServiceCheck], seconds: float | None) -> None:
    assert seconds_of(*checks) == seconds


def test_a_vm_made_by_no_group_has_no_time_read() -> None:
    backends = Backends(checks={GROUP: [check(10.0)]})
    assert GroupProbeTimes(backends, named).seconds("solo-0") is None
    assert backends.reads == 0


def test_a_groups_services_are_read_once_per_ttl() -> None:
    clock = FakeClock()
    backends = Backends({"web-0": GROUP, "web-1": GROUP}, {GROUP: [check(10.0)]})
    times = GroupProbeTimes(backends, named, clock=clock.monotonic)
    assert (times.seconds("web-0"), times.seconds("web-1")) == (10.0, 10.0)
    assert backends.reads == 1
    clock.advance(TTL_SECONDS)
    assert times.seconds("web-0") == 10.0
    assert backends.reads == 2


def test_the_readiness_drain_records_the_time_read() -> None:
    backends = Backends({"web-0": GROUP}, {GROUP: [check(10.0)]})
    balancer = ReadinessBalancer(
        RecordingSender(), clock=lambda: NOW, probe_seconds=GroupProbeTimes(backends, named).seconds
    )
    memento = balancer.locate("web-0")
    assert memento is not None
    assert memento["probe_seconds"] == 10.0


@pytest.mark.parametrize(
    ("overrides", "read"),
    [({}, True), ({"read_probes": False}, False), ({"trust_file": "trust.json"}, False)],
    ids=["default", "off", "trust-file"],
)
def test_the_probes_are_read_unless_turned_off_or_local(
    overrides: dict[str, object], read: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN the app wired, its Compute API unreachable (a trust file: local VMs, which no group holds)
    settings = settings_for(autohealer_check=False, policy=Policy(trust="reporter-name"), **overrides)
    deps = wiring.build_deps(settings, offline_clients(FakePublisher()))
    # WHEN a VM is located for a drain
    with caplog.at_level(logging.WARNING, logger="mbridge.functions"):
        memento = deps.balancer.locate("web-0")
    # THEN it is drained through /readyz on the policy's value either way, and the probes were asked
    # (and could not be read now) only when reading is on
    assert memento is not None
    assert "probe_seconds" not in memento[wiring.READINESS]
    assert any("could not be read" in record.getMessage() for record in caplog.records) is read
