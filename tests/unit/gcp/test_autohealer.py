"""Autohealer safety on Google Cloud (functions/gcp_app/autohealer.py): a drain through /readyz is
refused when the VM's managed instance group autoheals on the agent's readiness, and only then.
The group's configuration comes from an in-memory `MigReader`; the Compute API's reads of it are
tested against the API's stand-in (tests/contract/gcp/test_autohealer_reads.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from functions.core.balancers import AutohealerConflictError, ReadinessBalancer
from functions.gcp_app.autohealer import TTL_SECONDS, HealthCheckTarget, MigAutohealers, conflicting
from functions.trust.gce_instances import GceInstance
from tests.kit import FakeClock, RecordingSender
from tests.unit.gcp.test_entry import NOW

GROUP = "projects/shop-prod/zones/europe-west1-b/instanceGroupManagers/web"
READYZ = HealthCheckTarget("agent-readyz", "HTTP", "/readyz", 9797)
APP = HealthCheckTarget("app-health", "HTTP", "/health", 8080)


@dataclass
class Groups:
    """The `MigReader` of a project: which group made each instance, and its autohealing checks."""

    made_by: dict[str, str] = field(default_factory=dict)
    checks: dict[str, list[HealthCheckTarget]] = field(default_factory=dict)
    reads: int = 0

    def created_by(self, instance: GceInstance) -> str | None:
        return self.made_by.get(instance.name)

    def autohealing_checks(self, group_url: str) -> Sequence[HealthCheckTarget]:
        self.reads += 1
        return self.checks.get(group_url, [])


def named(vm: str) -> list[GceInstance]:
    return [GceInstance("shop-prod", "europe-west1-b", vm, "1001")]


@pytest.mark.parametrize(
    ("check", "conflicts"),
    [
        (READYZ, True),
        (HealthCheckTarget("q", "HTTP", "/readyz?full=1", 9797), True),  # the query is not the path
        (HealthCheckTarget("named", "HTTP", "/readyz", None), True),  # a named port cannot be ruled out
        (HealthCheckTarget("other-port", "HTTP", "/readyz", 8080), False),  # the application's own /readyz
        (HealthCheckTarget("healthz", "HTTPS", "/healthz", 9797), False),  # liveness: the right one
        (HealthCheckTarget("tcp", "TCP", None, 9797), False),  # a TCP check opens the port, reads nothing
        (APP, False),
    ],
    ids=["readyz", "readyz-query", "named-port", "other-port", "healthz", "tcp", "application"],
)
def test_only_a_check_on_the_agents_readiness_conflicts(check: HealthCheckTarget, conflicts: bool) -> None:
    assert (conflicting([check], "/readyz", 9797) is not None) is conflicts


def test_a_drain_that_would_get_the_vm_recreated_is_refused_before_anything_is_sent() -> None:
    # GIVEN web-0 made by a group that autoheals on the agent's /readyz
    groups = Groups(made_by={"web-0": GROUP}, checks={GROUP: [APP, READYZ]})
    sent = RecordingSender()
    balancer = ReadinessBalancer(sent, clock=lambda: NOW, guard=MigAutohealers(groups, named).conflict)

    # WHEN the functions would drain it through /readyz THEN it is refused, saying what to change
    with pytest.raises(AutohealerConflictError) as refused:
        balancer.locate("web-0")
    assert "europe-west1-b/web autoheals web-0 on the health check agent-readyz" in str(refused.value)
    assert "docs/gcp.md#autohealers" in str(refused.value)
    assert sent.commands == []


def test_a_vm_of_no_group_or_of_a_group_autohealing_elsewhere_is_drained() -> None:
    groups = Groups(made_by={"web-1": GROUP}, checks={GROUP: [APP]})
    balancer = ReadinessBalancer(RecordingSender(), clock=lambda: NOW, guard=MigAutohealers(groups, named).conflict)
    assert balancer.locate("web-1") is not None  # its group autoheals on the application's check
    assert balancer.locate("db-0") is not None  # made by no group


def test_a_groups_checks_are_read_once_per_ttl() -> None:
    # GIVEN two VMs of one group, drained in one wave, and again after the TTL
    clock = FakeClock()
    groups = Groups(made_by={"web-0": GROUP, "web-1": GROUP}, checks={GROUP: [APP]})
    guard = MigAutohealers(groups, named, clock=clock.monotonic)
    assert guard.conflict("web-0") is None
    assert guard.conflict("web-1") is None
    assert groups.reads == 1
    clock.advance(TTL_SECONDS)
    assert guard.conflict("web-0") is None
    assert groups.reads == 2
