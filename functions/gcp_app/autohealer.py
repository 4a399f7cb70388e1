"""Autohealer safety for drains through the agent's /readyz on Google Cloud (docs/gcp.md#autohealers).

A managed instance group's autohealing policy recreates an instance whose health check fails. If that
check is the agent's readiness (`/readyz` on its health port), a drain turns it unready on purpose and
the group recreates the VM: the maintenance becomes an outage and the VM's state is lost. So before a
VM is drained through /readyz, its group's autohealing checks are read, and a drain that would fail
one of them is refused (`AutohealerConflictError`, naming the group, the check and what to change).

What is read, with the function's identity (Compute Viewer-level reads: `compute.instances.get`,
`compute.instanceGroupManagers.get`, `compute.healthChecks.get`):

- the instance's `created-by` metadata item: the URL of the managed instance group that made it (an
  instance no group made has none, and nothing else to check);
- the group's `autoHealingPolicies[].healthCheck`, zonal or regional group;
- each health check's HTTP, HTTPS or HTTP/2 `requestPath` (default `/`) and `port` (default 80,
  443, 443). A check on the readiness path and the agent's health port is the conflict; a TCP or
  gRPC check, another path or another port is not. A check that uses a named port (`portSpecification`
  `USE_NAMED_PORT`) has no port to compare: it conflicts when its path is the readiness path.

A group's answer is kept for `TTL_SECONDS`: a wave drains many VMs of one group.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from google.api_core import exceptions as google_exceptions
from google.cloud import compute_v1

from functions.gcp_app.kept import PerGroup
from functions.trust.gce_instances import GceInstance
from wire.errors import PermanentError, RetryableError

READINESS_PATH = "/readyz"
AGENT_HEALTH_PORT = 9797  # the agent's default --listen port (agent/health/server.py)
TTL_SECONDS = 600.0
# What the reads need, on each trusted project (infra/terraform/gcp/iam.tf grants exactly these).
READ_PERMISSIONS = (
    "compute.instances.get",
    "compute.instanceGroupManagers.get",
    "compute.healthChecks.get",
    "compute.regionHealthChecks.get",
)
# A managed instance group's URL, zonal or regional.
MANAGED_GROUP = re.compile(
    r"projects/(?P<project>[^/]+)/(?P<where>zones|regions)/(?P<location>[^/]+)/instanceGroupManagers/(?P<name>[^/]+)$"
)
_CHECK = re.compile(
    r"projects/(?P<project>[^/]+)/(?:(?:regions/(?P<region>[^/]+))|global)/healthChecks/(?P<name>[^/]+)$"
)
_DEFAULT_PORTS = {"HTTP": 80, "HTTPS": 443, "HTTP2": 443}
# What the reads are for, as a refused read names it.
AUTOHEALING = "what autohealing a drained VM"


@dataclass(frozen=True)
class HealthCheckTarget:
    """What a health check probes: its name, protocol, path and port (None: a named port)."""

    name: str
    protocol: str
    path: str | None
    port: int | None


class MigReader(Protocol):
    def created_by(self, instance: GceInstance) -> str | None:
        """The URL of the managed instance group that made the instance, or None."""
        ...

    def autohealing_checks(self, group_url: str) -> Sequence[HealthCheckTarget]:
        """The health checks of the group's autohealing policies."""
        ...


def conflicting(checks: Sequence[HealthCheckTarget], path: str, port: int) -> HealthCheckTarget | None:
    """The first check that probes the agent's readiness, or None."""
    for check in checks:
        if check.path is None or check.path.split("?", 1)[0] != path:
            continue
        if check.port is None or check.port == port:
            return check
    return None


class MigAutohealers:
    """The guard of `ReadinessBalancer` (functions/core/balancers.py): `conflict(vm)` is the reason a
    drain through /readyz would get the VM recreated, or None."""

    def __init__(
        self,
        reader: MigReader,
        instances_named: Callable[[str], Sequence[GceInstance]],
        *,
        path: str = READINESS_PATH,
        port: int = AGENT_HEALTH_PORT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path, self._port = path, port
        self._groups = PerGroup(
            instances_named,
            reader.created_by,
            lambda group: tuple(reader.autohealing_checks(group)),
            ttl=TTL_SECONDS,
            clock=clock,
        )

    def conflict(self, vm: str) -> str | None:
        for group, checks in self._groups.of(vm):
            check = conflicting(checks, self._path, self._port)
            if check is not None:
                port = "a named port" if check.port is None else f"port {check.port}"
                return (
                    f"the managed instance group {_short(group)} autoheals {vm} on the health check {check.name} "
                    f"({check.protocol} {check.path} on {port}), which is the agent's readiness: draining it would "
                    f"get {vm} recreated. Give autohealing a check of its own (the agent's /healthz, or the "
                    "application's), keep /readyz for the load balancer's health check (docs/gcp.md#autohealers)"
                )
        return None


class ComputeMigReader:
    """`MigReader` over the Compute API (google-cloud-compute); `purpose` is what a refused read says the
    reads were for."""

    def __init__(
        self,
        instances: compute_v1.InstancesClient,
        groups: compute_v1.InstanceGroupManagersClient,
        region_groups: compute_v1.RegionInstanceGroupManagersClient,
        checks: compute_v1.HealthChecksClient,
        region_checks: compute_v1.RegionHealthChecksClient,
        timeout: float,
        purpose: str = AUTOHEALING,
    ) -> None:
        self._instances, self._groups, self._region_groups = instances, groups, region_groups
        self._checks, self._region_checks = checks, region_checks
        self._timeout = timeout
        self._purpose = purpose

    def created_by(self, instance: GceInstance) -> str | None:
        got = self._call(
            "compute.instances.get",
            lambda: self._instances.get(
                project=instance.project, zone=instance.zone, instance=instance.name, timeout=self._timeout
            ),
        )
        for item in got.metadata.items:
            where = MANAGED_GROUP.search(item.value) if item.key == "created-by" else None
            if where is not None:
                # The item names the project by number; the group is in the instance's own project.
                group = f"{where['where']}/{where['location']}/instanceGroupManagers/{where['name']}"
                return f"projects/{instance.project}/{group}"
        return None

    def autohealing_checks(self, group_url: str) -> Sequence[HealthCheckTarget]:
        where = MANAGED_GROUP.search(group_url)
        if where is None:
            return ()
        project, location, name = where["project"], where["location"], where["name"]
        if where["where"] == "zones":
            group = self._call(
                "compute.instanceGroupManagers.get",
                lambda: self._groups.get(
                    project=project, zone=location, instance_group_manager=name, timeout=self._timeout
                ),
            )
        else:
            group = self._call(
                "compute.instanceGroupManagers.get",
                lambda: self._region_groups.get(
                    project=project, region=location, instance_group_manager=name, timeout=self._timeout
                ),
            )
        return [self._target(policy.health_check) for policy in group.auto_healing_policies if policy.health_check]

    def _target(self, check_url: str) -> HealthCheckTarget:
        check = self.health_check(check_url)
        if check is None:
            return HealthCheckTarget(check_url, "UNKNOWN", None, None)
        return http_target(check_url.rsplit("/", 1)[-1], check)

    def health_check(self, check_url: str) -> Any | None:
        """The health check (global or regional) at `check_url`, as the API gives it; None for a URL that
        names none (a legacy HTTP health check)."""
        where = _CHECK.search(check_url)
        if where is None:
            return None
        project, region, name = where["project"], where["region"], where["name"]
        if region:
            return self._call(
                "compute.regionHealthChecks.get",
                lambda: self._region_checks.get(
                    project=project, region=region, health_check=name, timeout=self._timeout
                ),
            )
        return self._call(
            "compute.healthChecks.get",
            lambda: self._checks.get(project=project, health_check=name, timeout=self._timeout),
        )

    def _call(self, permission: str, call: Callable[[], Any]) -> Any:
        return compute_read(permission, self._purpose, call)


def compute_read(permission: str, purpose: str, call: Callable[[], Any]) -> Any:
    """`call`'s answer; a refused read as a PermanentError naming the permission, any other failure of
    the API as a RetryableError."""
    try:
        return call()
    except (google_exceptions.Forbidden, google_exceptions.PermissionDenied) as exc:
        raise PermanentError(
            f"the function's service account cannot read {purpose} ({permission}): {exc.message}"
        ) from exc
    except google_exceptions.GoogleAPICallError as exc:
        raise RetryableError(f"the Compute API did not answer a read of {purpose} ({permission}): {exc}") from exc


def http_target(name: str, check: Any) -> HealthCheckTarget:
    """What a health check resource probes."""
    protocol = str(check.type_ or "")
    http = {
        "HTTP": check.http_health_check,
        "HTTPS": check.https_health_check,
        "HTTP2": check.http2_health_check,
    }.get(protocol)
    if http is None:
        return HealthCheckTarget(name, protocol or "UNKNOWN", None, None)
    named = str(http.port_specification or "") == "USE_NAMED_PORT"
    port = None if named else (int(http.port) if http.port else _DEFAULT_PORTS[protocol])
    return HealthCheckTarget(name, protocol, str(http.request_path or "/"), port)


def _short(url: str) -> str:
    where = MANAGED_GROUP.search(url)
    return url if where is None else f"{where['location']}/{where['name']}"
