"""The reads of autohealing (functions/gcp_app/autohealer.py `ComputeMigReader`) through the real
Compute client (REST) against the API's stand-in: an instance's created-by, a zonal or regional
group's autohealing policies, global and regional health checks, and a refused read named.
"""

from __future__ import annotations

import pytest
from google.cloud import compute_v1

from functions.gcp_app.autohealer import ComputeMigReader, HealthCheckTarget, MigAutohealers
from tests.contract.gcp.test_compute import BASE, PROJECT, ZONE_B, Fixture
from wire.errors import PermanentError

ZONAL = f"projects/{PROJECT}/zones/{ZONE_B}/instanceGroupManagers/web"
REGIONAL = f"projects/{PROJECT}/regions/europe-west1/instanceGroupManagers/api"


def reader(compute: Fixture, **purpose: str) -> ComputeMigReader:
    options = compute.options()
    return ComputeMigReader(
        compute_v1.InstancesClient(**options),
        compute_v1.InstanceGroupManagersClient(**options),
        compute_v1.RegionInstanceGroupManagersClient(**options),
        compute_v1.HealthChecksClient(**options),
        compute_v1.RegionHealthChecksClient(**options),
        timeout=10.0,
        **purpose,
    )


def given_groups(compute: Fixture) -> None:
    api = compute.api
    web = api.given(ZONE_B, "web-0", "1001")
    api.given(ZONE_B, "api-0", "1002")
    api.given(ZONE_B, "solo-0", "1003")
    # created-by names the project by number, as Compute Engine writes it
    api.created_by[(PROJECT, ZONE_B, web.name)] = f"projects/123456789/zones/{ZONE_B}/instanceGroupManagers/web"
    api.created_by[(PROJECT, ZONE_B, "api-0")] = "projects/123456789/regions/europe-west1/instanceGroupManagers/api"
    api.managers[ZONAL] = [f"{BASE}/projects/{PROJECT}/global/healthChecks/agent-readyz"]
    api.managers[REGIONAL] = [f"{BASE}/projects/{PROJECT}/regions/europe-west1/healthChecks/app-named"]
    api.health_checks[f"projects/{PROJECT}/global/healthChecks/agent-readyz"] = {
        "type": "HTTP",
        "httpHealthCheck": {"port": 9797, "requestPath": "/readyz"},
    }
    api.health_checks[f"projects/{PROJECT}/regions/europe-west1/healthChecks/app-named"] = {
        "type": "HTTPS",
        "httpsHealthCheck": {"portSpecification": "USE_NAMED_PORT", "requestPath": "/healthz"},
    }


def test_the_groups_autohealing_checks_are_read_as_compute_engine_holds_them(compute: Fixture) -> None:
    given_groups(compute)
    mig = reader(compute)
    (web,) = compute.known_instances().instances_named("web-0")
    (api,) = compute.known_instances().instances_named("api-0")
    (solo,) = compute.known_instances().instances_named("solo-0")

    assert mig.created_by(web) == ZONAL  # in the instance's own project, not by number
    assert mig.created_by(api) == REGIONAL
    assert mig.created_by(solo) is None
    assert list(mig.autohealing_checks(ZONAL)) == [HealthCheckTarget("agent-readyz", "HTTP", "/readyz", 9797)]
    assert list(mig.autohealing_checks(REGIONAL)) == [HealthCheckTarget("app-named", "HTTPS", "/healthz", None)]


def test_the_guard_refuses_the_group_autohealing_on_readiness_only(compute: Fixture) -> None:
    given_groups(compute)
    guard = MigAutohealers(reader(compute), compute.known_instances().instances_named)
    refused = guard.conflict("web-0")
    assert refused is not None
    assert f"{ZONE_B}/web autoheals web-0 on the health check agent-readyz (HTTP /readyz on port 9797)" in refused
    assert guard.conflict("api-0") is None
    assert guard.conflict("solo-0") is None


def test_a_refused_read_names_what_the_service_account_lacks(compute: Fixture) -> None:
    given_groups(compute)
    compute.api.fail["instanceGroupManagers/web"] = [(403, "forbidden")]
    with pytest.raises(PermanentError, match=r"compute\.instanceGroupManagers\.get"):
        reader(compute).autohealing_checks(ZONAL)
