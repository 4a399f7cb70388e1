"""The probe's time of a readiness drain on Azure (functions/azure_app/probe_times.py) with the real
NetworkManagementClient against the ARM stand-in of test_load_balancer.py, given the load balancer as
GET loadBalancers returns it: the rules over the pools that hold a uniform scale set's instance,
their probes of /readyz, and a refused read named.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from functions.azure_app.probe_times import TTL_SECONDS, LoadBalancerProbeTimes, probe_reader
from functions.azure_app.settings import LoadBalancerTarget, Settings
from functions.core.balancers import ReadinessBalancer
from functions.core.ports import JsonObject
from tests.contract.azure import test_load_balancer as arm_stand_in
from tests.contract.azure.test_load_balancer import ARM_ID, LB, POOL_HTTP, RG, SUB, Arm, nic
from tests.kit import FakeClock, RecordingSender
from wire.errors import PermanentError, RetryableError

# The stand-in's fixtures, under the names the tests ask for.
certificate = arm_stand_in.certificate
arm = arm_stand_in.arm

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
LB_ID = f"{ARM_ID}/loadBalancers/{LB}"
SCALE_SET = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets/web"
TARGET = LoadBalancerTarget(subscription_id=SUB, resource_group=RG, name=LB, nic_resource_group=RG)


def instance_configuration(instance: int) -> str:
    """A uniform scale set instance's NIC configuration, as its pool lists it."""
    return f"{SCALE_SET}/virtualMachines/{instance}/networkInterfaces/web-nic/ipConfigurations/ipconfig1"


def pool(name: str, configurations: list[str]) -> JsonObject:
    return {
        "name": name,
        "id": f"{LB_ID}/backendAddressPools/{name}",
        "properties": {"backendIPConfigurations": [{"id": configuration} for configuration in configurations]},
    }


def probe(name: str, protocol: str, port: int, interval: int, **more: Any) -> JsonObject:
    return {
        "name": name,
        "id": f"{LB_ID}/probes/{name}",
        "properties": {"protocol": protocol, "port": port, "intervalInSeconds": interval, **more},
    }


def rule(name: str, pools: list[str], probe_name: str | None) -> JsonObject:
    properties: JsonObject = {
        "protocol": "Tcp",
        "frontendPort": 443,
        "backendPort": 443,
        "backendAddressPool": {"id": f"{LB_ID}/backendAddressPools/{pools[0]}"},
        "backendAddressPools": [{"id": f"{LB_ID}/backendAddressPools/{name}"} for name in pools],
    }
    if probe_name is not None:
        properties["probe"] = {"id": f"{LB_ID}/probes/{probe_name}"}
    return {"name": name, "id": f"{LB_ID}/loadBalancingRules/{name}", "properties": properties}


def load_balancer(
    pools: list[JsonObject], rules: list[JsonObject], probes: list[JsonObject], name: str = LB
) -> JsonObject:
    """A load balancer as GET loadBalancers returns it (trimmed of what the reader never reads)."""
    return {
        "name": name,
        "id": f"{ARM_ID}/loadBalancers/{name}",
        "etag": 'W/"00000000-0000-0000-0000-000000000001"',
        "type": "Microsoft.Network/loadBalancers",
        "location": "westeurope",
        "sku": {"name": "Standard", "tier": "Regional"},
        "properties": {
            "provisioningState": "Succeeded",
            "backendAddressPools": pools,
            "loadBalancingRules": rules,
            "probes": probes,
        },
    }


READYZ = {"requestPath": "/readyz", "probeThreshold": 2, "numberOfProbes": 5}


def given_the_load_balancer(arm: Arm) -> None:
    """web_3 and web_4 in pool-vmss, which a rule probes on /readyz (5 s x 2) and another over TCP;
    web_3 also in pool-slow, probed on /readyz every 10 s, 4 probes (no threshold); web_5 only in
    pool-tcp; web-0 a standalone VM in pool-http by its NIC (the pool edit's); pool-other, probed on
    /readyz, holds web_6."""
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP]))
    arm.fake.add(
        load_balancer(
            pools=[
                pool("pool-vmss", [instance_configuration(3), instance_configuration(4)]),
                pool("pool-slow", [instance_configuration(3)]),
                pool("pool-tcp", [instance_configuration(5)]),
                pool("pool-http", [f"{ARM_ID}/networkInterfaces/web-0-nic/ipConfigurations/ipconfig1"]),
                pool("pool-other", [instance_configuration(6)]),
            ],
            rules=[
                rule("https", ["pool-vmss"], "readyz"),
                rule("tcp", ["pool-vmss", "pool-tcp"], "tcp"),
                rule("slow", ["pool-slow"], "slow-readyz"),
                rule("http", ["pool-http"], "readyz"),
                rule("other", ["pool-other"], "other-readyz"),
                rule("no-probe", ["pool-vmss"], None),
            ],
            probes=[
                probe("readyz", "Http", 9797, 5, **READYZ),
                probe("tcp", "Tcp", 443, 60, numberOfProbes=10),
                probe("slow-readyz", "Https", 9797, 10, requestPath="/readyz", numberOfProbes=4),
                probe("other-readyz", "Http", 9797, 30, requestPath="/readyz", probeThreshold=10),
            ],
        )
    )


def times(arm: Arm, **options: Any) -> LoadBalancerProbeTimes:
    return LoadBalancerProbeTimes(arm.client, TARGET, **options)


def test_an_instance_counts_with_the_slowest_readiness_probe_of_its_pools(arm: Arm) -> None:
    given_the_load_balancer(arm)
    reader = times(arm)
    # pool-slow's 10 s x 4 probes, over pool-vmss's 5 s x a threshold of 2; TCP probes see no drain
    assert reader.seconds("web_3") == 40.0
    assert reader.seconds("web_4") == 10.0
    assert reader.seconds("web_5") is None  # probed over TCP only
    assert reader.seconds("web_9") is None  # in no pool
    assert reader.seconds("web-0") is None  # out of pool-http by the pool edit, at once
    # one read of the load balancer, nothing written
    assert [(request.method, request.path) for request in arm.fake.requests] == [("GET", LB_ID)]


@pytest.mark.parametrize(
    ("changed", "seconds"),
    [
        ({"port": 8080}, None),  # the application's own /readyz
        ({"requestPath": "/health"}, None),
        ({"requestPath": "/readyz?full=1"}, 10.0),  # the query is not the path
        ({"probeThreshold": None}, 25.0),  # the older numberOfProbes then
        ({"intervalInSeconds": None}, None),  # not read to the end: the policy's value
    ],
    ids=["other-port", "other-path", "query", "number-of-probes", "no-interval"],
)
def test_only_a_probe_of_the_agents_readiness_counts(arm: Arm, changed: JsonObject, seconds: float | None) -> None:
    properties = {"protocol": "Http", "port": 9797, "intervalInSeconds": 5, **READYZ, **changed}
    arm.fake.add(
        load_balancer(
            pools=[pool("pool-vmss", [instance_configuration(3)])],
            rules=[rule("https", ["pool-vmss"], "readyz")],
            probes=[{"name": "readyz", "id": f"{LB_ID}/probes/readyz", "properties": properties}],
        )
    )
    assert times(arm).seconds("web_3") == seconds


def test_the_load_balancer_is_read_once_per_ttl(arm: Arm) -> None:
    given_the_load_balancer(arm)
    clock = FakeClock()
    reader = times(arm, clock=clock.monotonic)
    assert (reader.seconds("web_3"), reader.seconds("web_4")) == (40.0, 10.0)
    clock.advance(TTL_SECONDS)
    assert reader.seconds("web_3") == 40.0
    assert len(arm.fake.requests) == 2


@pytest.mark.parametrize(
    ("status", "error", "says"),
    [
        (403, PermanentError, r"Microsoft\.Network/loadBalancers/read"),
        (404, PermanentError, "MBRIDGE_LB_"),
        (429, RetryableError, "HTTP 429"),
        (500, RetryableError, "HTTP 500"),
    ],
)
def test_a_failed_read_says_why(arm: Arm, status: int, error: type[Exception], says: str) -> None:
    given_the_load_balancer(arm)
    arm.fake.faults.append(arm_stand_in.Fault("GET", f"/loadBalancers/{LB}", status))
    with pytest.raises(error, match=says):
        times(arm).seconds("web_3")


def test_a_readiness_drain_records_the_time_read_and_falls_back_when_refused(arm: Arm) -> None:
    given_the_load_balancer(arm)
    settings = Settings.from_env(ENVIRONMENT)
    read = probe_reader(settings, arm.client)
    assert read is not None
    balancer = ReadinessBalancer(RecordingSender(), clock=lambda: NOW, probe_seconds=read)
    located = balancer.locate("web_3")
    assert located is not None
    assert located["probe_seconds"] == 40.0
    # a refused read (the role without loadBalancers/read) leaves the policy's value, and the drain
    arm.fake.faults.append(arm_stand_in.Fault("GET", f"/loadBalancers/{LB}", 403))
    fresh = ReadinessBalancer(RecordingSender(), clock=lambda: NOW, probe_seconds=probe_reader(settings, arm.client))
    located = fresh.locate("web_3")
    assert located is not None
    assert "probe_seconds" not in located


ENVIRONMENT = {
    "MBRIDGE_EVENTS_TOPIC": "maintenance-events",
    "MBRIDGE_EVENTS_SUBSCRIPTION": "functions",
    "MBRIDGE_SERVICEBUS__fullyQualifiedNamespace": "mybus.servicebus.windows.net",
    "MBRIDGE_TABLE_ENDPOINT": "https://account.table.core.windows.net",
    "MBRIDGE_LB_SUBSCRIPTION_ID": SUB,
    "MBRIDGE_LB_RESOURCE_GROUP": RG,
    "MBRIDGE_LB_NAME": LB,
    "MBRIDGE_POLICY": '{"trust": "reporter-name"}',
}


@pytest.mark.parametrize(
    ("more", "read"),
    [({}, True), ({"MBRIDGE_READ_PROBES": "false"}, False), ({"MBRIDGE_LB_NAME": ""}, False)],
    ids=["default", "off", "no-load-balancer"],
)
def test_the_probe_is_read_unless_turned_off(arm: Arm, more: dict[str, str], read: bool) -> None:
    environment = {**ENVIRONMENT, **more}
    if not environment["MBRIDGE_LB_NAME"]:
        environment = {key: value for key, value in environment.items() if not key.startswith("MBRIDGE_LB_")}
        environment["MBRIDGE_TRUST_SUBSCRIPTIONS"] = SUB
    assert (probe_reader(Settings.from_env(environment), arm.client) is not None) is read
