"""The reads of the backend services' health checks (functions/gcp_app/probe_times.py
`ComputeBackendReader`) through the real Compute clients (REST) against the API's stand-in: the
services of a managed group, global and of its region, their health checks, and a refused list named.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.cloud import compute_v1

from functions.gcp_app.autohealer import HealthCheckTarget
from functions.gcp_app.probe_times import PURPOSE, ComputeBackendReader, GroupProbeTimes, ServiceCheck
from tests.contract.gcp.test_autohealer_reads import reader as mig_reader
from tests.contract.gcp.test_compute import BASE, PROJECT, ZONE_B, Fixture
from wire.errors import PermanentError

REGION = "europe-west1"
ZONAL = f"projects/{PROJECT}/zones/{ZONE_B}/instanceGroupManagers/web"
REGIONAL = f"projects/{PROJECT}/regions/{REGION}/instanceGroupManagers/api"
READYZ = f"{BASE}/projects/{PROJECT}/global/healthChecks/agent-readyz"
SLOW_READYZ = f"{BASE}/projects/{PROJECT}/regions/{REGION}/healthChecks/ilb-readyz"
TCP = f"{BASE}/projects/{PROJECT}/global/healthChecks/app-tcp"


def reader(compute: Fixture) -> ComputeBackendReader:
    options = compute.options()
    return ComputeBackendReader(
        mig_reader(compute, purpose=PURPOSE),
        compute_v1.BackendServicesClient(**options),
        compute_v1.RegionBackendServicesClient(**options),
        timeout=10.0,
    )


def service(name: str, groups: list[str], checks: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "backends": [{"group": f"{BASE}/{group}", "balancingMode": "UTILIZATION"} for group in groups],
        "healthChecks": checks,
    }


def given_balancers(compute: Fixture) -> None:
    """web-0 of the zonal group web, behind a global external service (readiness, 5 s x 2) and a
    regional internal one (readiness, 10 s x 3, and a TCP check); api-0 of the regional group api,
    behind a service of the TCP check only; solo-0 made by no group."""
    api = compute.api
    for vm, instance_id in (("web-0", "1001"), ("api-0", "1002"), ("solo-0", "1003")):
        api.given(ZONE_B, vm, instance_id)
    api.created_by[(PROJECT, ZONE_B, "web-0")] = f"projects/123456789/zones/{ZONE_B}/instanceGroupManagers/web"
    api.created_by[(PROJECT, ZONE_B, "api-0")] = f"projects/123456789/regions/{REGION}/instanceGroupManagers/api"
    web, api_group = (
        f"projects/{PROJECT}/zones/{ZONE_B}/instanceGroups/web",
        f"projects/{PROJECT}/regions/{REGION}/instanceGroups/api",
    )
    api.backend_services[f"projects/{PROJECT}/global"] = [
        service("web-external", [web], [READYZ]),
        service("api-external", [api_group], [TCP]),
        service("other", [f"projects/{PROJECT}/zones/{ZONE_B}/instanceGroups/other"], [READYZ]),
    ]
    api.backend_services[f"projects/{PROJECT}/regions/{REGION}"] = [service("web-internal", [web], [SLOW_READYZ, TCP])]
    api.health_checks[f"projects/{PROJECT}/global/healthChecks/agent-readyz"] = {
        "type": "HTTP",
        "checkIntervalSec": 5,
        "unhealthyThreshold": 2,
        "httpHealthCheck": {"port": 9797, "requestPath": "/readyz"},
    }
    api.health_checks[f"projects/{PROJECT}/regions/{REGION}/healthChecks/ilb-readyz"] = {
        "type": "HTTP",
        "checkIntervalSec": 10,
        "unhealthyThreshold": 3,
        "httpHealthCheck": {"port": 9797, "requestPath": "/readyz"},
    }
    api.health_checks[f"projects/{PROJECT}/global/healthChecks/app-tcp"] = {
        "type": "TCP",
        "checkIntervalSec": 30,
        "unhealthyThreshold": 10,
        "tcpHealthCheck": {"port": 443},
    }


def test_the_services_of_a_group_and_their_checks_are_read_as_compute_engine_holds_them(compute: Fixture) -> None:
    given_balancers(compute)
    backends = reader(compute)
    readyz, slow = (
        HealthCheckTarget("agent-readyz", "HTTP", "/readyz", 9797),
        HealthCheckTarget("ilb-readyz", "HTTP", "/readyz", 9797),
    )
    tcp = HealthCheckTarget("app-tcp", "TCP", None, None)
    # a zonal group: the global services and those of its zone's region
    assert list(backends.service_checks(ZONAL)) == [
        ServiceCheck("web-external", readyz, 10.0),
        ServiceCheck("web-internal", slow, 30.0),
        ServiceCheck("web-internal", tcp, 300.0),
    ]
    assert list(backends.service_checks(REGIONAL)) == [ServiceCheck("api-external", tcp, 300.0)]
    # each service list read once, each check once, whatever shares it
    assert [request.path.split("/compute/v1/", 1)[1] for request in compute.api.requests] == [
        f"projects/{PROJECT}/global/backendServices",
        f"projects/{PROJECT}/regions/{REGION}/backendServices",
        f"projects/{PROJECT}/global/healthChecks/agent-readyz",
        f"projects/{PROJECT}/regions/{REGION}/healthChecks/ilb-readyz",
        f"projects/{PROJECT}/global/healthChecks/app-tcp",
        f"projects/{PROJECT}/global/backendServices",
        f"projects/{PROJECT}/regions/{REGION}/backendServices",
        f"projects/{PROJECT}/global/healthChecks/app-tcp",
    ]


def test_a_vm_counts_with_the_slowest_check_of_its_readiness(compute: Fixture) -> None:
    given_balancers(compute)
    times = GroupProbeTimes(reader(compute), compute.known_instances().instances_named)
    assert times.seconds("web-0") == 30.0  # the internal balancer's 10 s x 3; the TCP check sees no drain
    assert times.seconds("api-0") is None  # only a TCP check: nothing read, the policy's value
    assert times.seconds("solo-0") is None  # made by no group


@pytest.mark.parametrize(
    ("refused", "permission"),
    [
        ("global/backendServices", r"compute\.backendServices\.list"),
        (f"regions/{REGION}/backendServices", r"compute\.regionBackendServices\.list"),
        ("healthChecks/ilb-readyz", r"compute\.regionHealthChecks\.get"),
    ],
)
def test_a_refused_read_names_what_the_service_account_lacks(compute: Fixture, refused: str, permission: str) -> None:
    given_balancers(compute)
    compute.api.fail[refused] = [(403, "forbidden")]
    with pytest.raises(PermanentError, match=rf"load balancers' health checks of a drained VM \({permission}\)"):
        reader(compute).service_checks(ZONAL)
