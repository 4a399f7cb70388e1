"""How long the load balancers in front of a VM on Google Cloud take to see it unready after a drain
through its agent's /readyz (docs/gcp.md#probe-times, docs/policy.md#probe-aware-drains): the reader
`ReadinessBalancer` is given.

A readiness drain is what takes the VM out of the backend services whose backends include its
managed instance group: those are the balancers read. (An unmanaged group of MBRIDGE_INSTANCE_GROUPS
is drained by taking the VM out of the group, at once; it does not count.) What is read, with the
function's identity:

- the instance's `created-by` metadata item: its managed instance group (`compute.instances.get`,
  as the autohealer check reads it); an instance no group made has no balancer read here;
- the backend services of the instance's project, global and of the group's region
  (`compute.backendServices.list`, `compute.regionBackendServices.list`), keeping those with the
  group's instance group among their backends;
- their health checks (`compute.healthChecks.get`, `compute.regionHealthChecks.get`). A check that
  probes the agent's readiness (`/readyz` on its health port, or on a named port) sees the drain
  after `checkIntervalSec` x `unhealthyThreshold`; the longest of them is the answer. A check of
  anything else (TCP, another path or port) does not see the drain and does not count.

No answer (None: the policy's `readiness_probe_seconds` is used) when no backend service probes the
VM's readiness, and when one of the checks that may cannot be read to the end: a legacy HTTP health
check, or one without its interval or threshold. A group's answer is kept for `TTL_SECONDS`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from google.cloud import compute_v1

from functions.gcp_app.autohealer import (
    AGENT_HEALTH_PORT,
    MANAGED_GROUP,
    READINESS_PATH,
    ComputeMigReader,
    HealthCheckTarget,
    compute_read,
    conflicting,
    http_target,
)
from functions.gcp_app.kept import PerGroup
from functions.trust.gce_instances import GceInstance

LOG = logging.getLogger("mbridge.gcp.probe_times")

TTL_SECONDS = 600.0
# What the reads need besides the autohealer check's (infra/terraform/gcp/iam.tf grants both).
READ_PERMISSIONS = ("compute.backendServices.list", "compute.regionBackendServices.list")
# What a refused read says the reads were for.
PURPOSE = "the load balancers' health checks of a drained VM"


@dataclass(frozen=True)
class ServiceCheck:
    """A health check of a backend service that sends to a group: what it probes, and how long it
    takes to find a backend unhealthy (None: not read to the end)."""

    service: str
    check: HealthCheckTarget
    seconds: float | None


class BackendReader(Protocol):
    def created_by(self, instance: GceInstance) -> str | None:
        """The URL of the managed instance group that made the instance, or None."""
        ...

    def service_checks(self, group_url: str) -> Sequence[ServiceCheck]:
        """The health checks of the backend services whose backends include the managed group."""
        ...


class GroupProbeTimes:
    """`seconds(vm)`: the probe's time of the backend services that probe the VM's readiness, or None."""

    def __init__(
        self,
        reader: BackendReader,
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
            lambda group: tuple(reader.service_checks(group)),
            ttl=TTL_SECONDS,
            clock=clock,
        )

    def seconds(self, vm: str) -> float | None:
        found: list[float] = []
        for _, checks in self._groups.of(vm):
            for probe in checks:
                # A check whose kind was not read (a legacy HTTP health check) may probe the readiness.
                unread = probe.check.path is None and probe.check.protocol == "UNKNOWN"
                if not unread and conflicting([probe.check], self._path, self._port) is None:
                    continue  # it does not probe the agent's readiness: the drain does not turn it
                if probe.seconds is None:
                    LOG.info(
                        "the health check %s of backend service %s was not read to the end: %s counts with the "
                        "policy's readiness_probe_seconds",
                        probe.check.name,
                        probe.service,
                        vm,
                    )
                    return None
                found.append(probe.seconds)
        return max(found, default=None)


class ComputeBackendReader:
    """`BackendReader` over the Compute API (google-cloud-compute): the instance and the health checks
    through a `ComputeMigReader`, the backend services through their own clients."""

    def __init__(
        self,
        mig: ComputeMigReader,
        services: compute_v1.BackendServicesClient,
        region_services: compute_v1.RegionBackendServicesClient,
        timeout: float,
    ) -> None:
        self._mig = mig
        self._services, self._region_services = services, region_services
        self._timeout = timeout

    def created_by(self, instance: GceInstance) -> str | None:
        return self._mig.created_by(instance)

    def service_checks(self, group_url: str) -> Sequence[ServiceCheck]:
        where = MANAGED_GROUP.search(group_url)
        if where is None:
            return ()
        project, location = where["project"], where["location"]
        # A managed group's instance group has the group's own name and place.
        group = f"projects/{project}/{where['where']}/{location}/instanceGroups/{where['name']}"
        region = location if where["where"] == "regions" else location.rsplit("-", 1)[0]
        services = [*self._global_services(project), *self._regional_services(project, region)]
        using = [service for service in services if any(_same(b.group, group) for b in service.backends)]
        checks: dict[str, Any] = {}
        found: list[ServiceCheck] = []
        for service in using:
            for url in service.health_checks:
                if url not in checks:
                    checks[url] = self._mig.health_check(url)
                found.append(_service_check(str(service.name), url, checks[url]))
        return found

    def _global_services(self, project: str) -> list[Any]:
        services: list[Any] = compute_read(
            "compute.backendServices.list",
            PURPOSE,
            lambda: list(self._services.list(project=project, timeout=self._timeout)),
        )
        return services

    def _regional_services(self, project: str, region: str) -> list[Any]:
        services: list[Any] = compute_read(
            "compute.regionBackendServices.list",
            PURPOSE,
            lambda: list(self._region_services.list(project=project, region=region, timeout=self._timeout)),
        )
        return services


def _service_check(service: str, url: str, check: Any | None) -> ServiceCheck:
    name = url.rsplit("/", 1)[-1]
    if check is None:
        return ServiceCheck(service, HealthCheckTarget(name, "UNKNOWN", None, None), None)
    interval, threshold = int(check.check_interval_sec or 0), int(check.unhealthy_threshold or 0)
    seconds = float(interval * threshold) if interval > 0 and threshold > 0 else None
    return ServiceCheck(service, http_target(name, check), seconds)


def _same(backend_group: str, group: str) -> bool:
    """Whether a backend's group URL (full, or relative to the API) names the instance group `group`."""
    return backend_group == group or backend_group.endswith(f"/{group}")
