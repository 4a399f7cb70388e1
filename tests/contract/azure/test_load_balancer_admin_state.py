"""AzureLoadBalancer with the drain method `admin-state`, through the real NetworkManagementClient
against the ARM stand-in of test_load_balancer.py: a VM's pool entries are set Down and set back to
what they were; no NIC is read for a uniform scale set's instance, none is ever written; a pool that
serves a rule without a health probe is refused before anything changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from functions.azure_app.load_balancer import (
    ADMIN_STATE,
    POOL_EDIT,
    AzureLoadBalancer,
    LoadBalancerConfigError,
    nics_in_resource_group,
    uniform_instances,
)
from functions.azure_app.settings import LB_DRAIN, SettingsError
from functions.core.ports import JsonObject
from functions.trust.verifiers import VmRecord
from tests.contract.azure import test_load_balancer as pool_edits
from tests.contract.azure.test_load_balancer import (
    ARM_ID,
    LB,
    POOL_HTTP,
    POOL_IP,
    RG,
    SUB,
    THREE_ENTRIES,
    VNET,
    Arm,
    FakeArm,
    Fault,
    _through_the_store,
    drain,
    ip_pool,
    nic,
    nic_pool,
)

# The ARM stand-in over HTTPS, and its certificate: the fixtures of the pool-edit tests.
arm = pool_edits.arm
certificate = pool_edits.certificate

LB_ID = f"{ARM_ID}/loadBalancers/{LB}"
PROBE = f"{LB_ID}/probes/readyz"
POOL_OUTBOUND = f"{LB_ID}/backendAddressPools/pool-outbound"
WEB_0_IPC = f"{ARM_ID}/networkInterfaces/web-0-nic/ipConfigurations/ipconfig1"
WEB_1_IPC = f"{ARM_ID}/networkInterfaces/web-1-nic/ipConfigurations/ipconfig1"
SCALE_SET = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets/web"
# A uniform scale set's instances: their NICs live inside the set.
INSTANCE_3_IPC = f"{SCALE_SET}/virtualMachines/3/networkInterfaces/web-nic/ipConfigurations/ipconfig1"
INSTANCE_4_IPC = f"{SCALE_SET}/virtualMachines/4/networkInterfaces/web-nic/ipConfigurations/ipconfig1"
INSTANCE_30_IPC = f"{SCALE_SET}/virtualMachines/30/networkInterfaces/web-nic/ipConfigurations/ipconfig1"


def load_balancer(rules: dict[str, tuple[str, str | None]]) -> JsonObject:
    """The load balancer as GET loadBalancers returns it (trimmed): rule name → (pool id, probe id)."""
    return {
        "name": LB,
        "id": LB_ID,
        "etag": 'W/"00000000-0000-0000-0000-000000000001"',
        "type": "Microsoft.Network/loadBalancers",
        "location": "westeurope",
        "sku": {"name": "Standard", "tier": "Regional"},
        "properties": {
            "provisioningState": "Succeeded",
            "probes": [
                {
                    "name": "readyz",
                    "id": PROBE,
                    "properties": {"protocol": "Http", "port": 9797, "requestPath": "/readyz", "intervalInSeconds": 5},
                }
            ],
            "loadBalancingRules": [
                {
                    "name": name,
                    "id": f"{LB_ID}/loadBalancingRules/{name}",
                    "properties": {
                        "protocol": "Tcp",
                        "frontendPort": 443,
                        "backendPort": 443,
                        "backendAddressPool": {"id": pool},
                        "backendAddressPools": [{"id": pool}],
                        **({"probe": {"id": probe}} if probe else {}),
                    },
                }
                for name, (pool, probe) in rules.items()
            ],
        },
    }


def admin_states(fake: FakeArm, pool_id: str) -> dict[str, str]:
    """Entry name → its admin state as stored (None when it has none)."""
    return {
        entry["name"]: entry["properties"].get("adminState", "None")
        for entry in fake.get(pool_id)["properties"]["loadBalancerBackendAddresses"]
    }


def by_admin_state(arm: Arm, **options: Any) -> AzureLoadBalancer:
    return AzureLoadBalancer(
        arm.client, SUB, RG, LB, nics_in_resource_group(arm.client, RG), method=ADMIN_STATE, **options
    )


class Directory:
    """The scope's VMs by name (the part of VmDirectory the uniform lookup reads)."""

    def __init__(self, *resource_ids: str) -> None:
        self._records = [VmRecord(rid.rsplit("/", 1)[-1], rid, f"vm-{n}") for n, rid in enumerate(resource_ids)]

    def resource_of(self, subscription_id: str, vm_id: str) -> VmRecord | None:
        return None

    def named(self, name: str) -> Sequence[VmRecord]:
        return [record for record in self._records if _name_of(record.resource_id) == name.lower()]


def _name_of(resource_id: str) -> str:
    """A uniform scale set's instance is named `<set>_<instance id>` in Scheduled Events."""
    parts = resource_id.lower().split("/")
    if "virtualmachinescalesets" in parts:
        return f"{parts[parts.index('virtualmachinescalesets') + 1]}_{parts[-1]}"
    return parts[-1]


@pytest.fixture
def web(arm: Arm) -> Arm:
    """web-0 and web-1 in the NIC-based pool-http and, by IP, in pool-ip; both pools behind rules
    with the /readyz probe."""
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP]))
    arm.fake.add(nic("web-1-nic", "web-1", "10.0.1.5", [POOL_HTTP]))
    arm.fake.add(nic_pool("pool-http", [WEB_0_IPC, WEB_1_IPC]))
    arm.fake.add(ip_pool("pool-ip", THREE_ENTRIES))
    arm.fake.add(load_balancer({"https": (POOL_HTTP, PROBE), "https-ip": (POOL_IP, PROBE)}))
    return arm


def test_a_drain_sets_the_vms_entries_down_in_every_pool_and_writes_no_nic(web: Arm) -> None:
    # WHEN web-0 is drained by admin state
    memento = drain(by_admin_state(web), "web-0")

    # THEN its entry in each pool is Down, every other entry is as it was, and only pools were written
    assert memento == {
        "admin": [
            {"pool_id": POOL_HTTP, "name": "member-0", "ip_configuration_id": WEB_0_IPC, "was": "None"},
            {"pool_id": POOL_IP, "name": "web-0-addr", "ip_address": "10.0.1.4", "was": "None"},
        ]
    }
    assert admin_states(web.fake, POOL_HTTP) == {"member-0": "Down", "member-1": "None"}
    assert admin_states(web.fake, POOL_IP) == {"web-0-addr": "Down", "web-1-addr": "None", "web-2-addr": "None"}
    assert {put.path.lower() for put in web.fake.puts()} == {POOL_HTTP.lower(), POOL_IP.lower()}
    # AND every entry is still in its pool, the NIC-based ones still naming their ipConfiguration
    entries = web.fake.get(POOL_HTTP)["properties"]["loadBalancerBackendAddresses"]
    assert [entry["properties"]["networkInterfaceIPConfiguration"]["id"] for entry in entries] == [WEB_0_IPC, WEB_1_IPC]
    assert len(web.fake.get(POOL_IP)["properties"]["loadBalancerBackendAddresses"]) == 3


def test_restore_sets_the_entries_back_and_a_second_restore_writes_nothing(web: Arm) -> None:
    # GIVEN web-0 drained by admin state
    balancer = by_admin_state(web)
    memento = _through_the_store(drain(balancer, "web-0"))
    writes = len(web.fake.puts())

    # WHEN it is restored, twice (a redelivery)
    balancer.restore("web-0", memento)
    balancer.restore("web-0", memento)

    # THEN its entries are back as they were, written once each
    assert admin_states(web.fake, POOL_HTTP) == {"member-0": "None", "member-1": "None"}
    assert admin_states(web.fake, POOL_IP) == {"web-0-addr": "None", "web-1-addr": "None", "web-2-addr": "None"}
    assert len(web.fake.puts()) == writes + 2


def test_a_redelivered_drain_writes_nothing_more(web: Arm) -> None:
    balancer = by_admin_state(web)
    memento = _through_the_store(drain(balancer, "web-0"))
    writes = len(web.fake.puts())

    balancer.remove("web-0", memento)

    assert len(web.fake.puts()) == writes


def test_an_instance_of_a_uniform_scale_set_is_drained_by_its_entries_without_reading_a_nic(arm: Arm) -> None:
    # GIVEN instances 3, 4 and 30 of the uniform scale set `web` in the NIC-based pool-http, whose
    # NICs no NIC listing of the resource group shows
    arm.fake.add(nic_pool("pool-http", [INSTANCE_3_IPC, INSTANCE_4_IPC, INSTANCE_30_IPC]))
    arm.fake.add(load_balancer({"https": (POOL_HTTP, PROBE)}))
    directory = Directory(f"{SCALE_SET}/virtualMachines/3", f"{SCALE_SET}/virtualMachines/4")
    balancer = by_admin_state(arm, scale_set_instance=uniform_instances(directory))

    # WHEN web_3 is drained, then restored
    memento = _through_the_store(drain(balancer, "web_3"))
    drained = admin_states(arm.fake, POOL_HTTP)
    balancer.restore("web_3", memento)

    # THEN its entry was Down and is back, instances 4 and 30 never changed, and no NIC was asked for
    assert memento["admin"] == [
        {"pool_id": POOL_HTTP, "name": "member-0", "ip_configuration_id": INSTANCE_3_IPC, "was": "None"}
    ]
    assert drained == {"member-0": "Down", "member-1": "None", "member-2": "None"}
    assert admin_states(arm.fake, POOL_HTTP) == {"member-0": "None", "member-1": "None", "member-2": "None"}
    assert not [request for request in arm.fake.requests if "/networkinterfaces" in request.path.lower()]


def test_pool_edits_cannot_reach_a_uniform_instance_which_is_why_admin_state_exists(arm: Arm) -> None:
    # The same fleet drained by pool edits: nothing is found to take out.
    arm.fake.add(nic_pool("pool-http", [INSTANCE_3_IPC, INSTANCE_4_IPC]))
    arm.fake.add(load_balancer({"https": (POOL_HTTP, PROBE)}))

    assert arm.balancer(method=POOL_EDIT).locate("web_3") is None


def test_a_pool_behind_a_rule_without_a_probe_is_refused_before_anything_changes(web: Arm) -> None:
    # GIVEN pool-ip also serves a rule without a health probe, where admin state does not apply
    web.fake.add(load_balancer({"https": (POOL_HTTP, PROBE), "raw-tcp": (POOL_IP, None)}))

    # WHEN web-0 is located THEN the drain is refused naming the rule and what to do, and nothing changed
    with pytest.raises(LoadBalancerConfigError, match=r"raw-tcp.*without a health probe.*MBRIDGE_LB_DRAIN=pool-edit"):
        by_admin_state(web).locate("web-0")
    assert web.fake.puts() == []


def test_a_pool_that_serves_no_load_balancing_rule_is_left_alone(web: Arm) -> None:
    # GIVEN web-0 also in an outbound-only pool (no load-balancing rule sends to it)
    web.fake.add(nic_pool("pool-outbound", [WEB_0_IPC]))

    memento = by_admin_state(web).locate("web-0")

    assert memento is not None
    assert POOL_OUTBOUND not in {part["pool_id"] for part in memento["admin"]}


def test_an_entry_an_operator_had_set_down_stays_down_after_the_restore(web: Arm) -> None:
    # GIVEN web-0's entry in pool-http already Down (an operator's maintenance)
    web.fake.change(POOL_HTTP, _set_state("member-0", "Down"))
    balancer = by_admin_state(web)

    # WHEN the maintenance drains and restores web-0
    memento = _through_the_store(drain(balancer, "web-0"))
    balancer.restore("web-0", memento)

    # THEN the operator's Down is kept; the entry the drain set down is back
    assert admin_states(web.fake, POOL_HTTP)["member-0"] == "Down"
    assert admin_states(web.fake, POOL_IP)["web-0-addr"] == "None"


def test_an_entry_an_operator_brought_up_during_the_drain_is_left_as_they_set_it(web: Arm) -> None:
    balancer = by_admin_state(web)
    memento = _through_the_store(drain(balancer, "web-0"))
    web.fake.change(POOL_HTTP, _set_state("member-0", "Up"))

    balancer.restore("web-0", memento)

    assert admin_states(web.fake, POOL_HTTP)["member-0"] == "Up"


def test_a_name_reused_for_another_ip_is_not_touched_by_the_restore(web: Arm) -> None:
    # GIVEN web-0 drained, then its IP entry re-created under the same name for another address
    balancer = by_admin_state(web)
    memento = _through_the_store(drain(balancer, "web-0"))

    def replace(document: JsonObject) -> None:
        entry = document["properties"]["loadBalancerBackendAddresses"][0]
        entry["properties"] = {"ipAddress": "10.0.1.9", "virtualNetwork": {"id": VNET}, "adminState": "Down"}

    web.fake.change(POOL_IP, replace)

    # WHEN web-0 is restored THEN the other address's entry keeps its state
    balancer.restore("web-0", memento)
    assert admin_states(web.fake, POOL_IP)["web-0-addr"] == "Down"


def test_a_concurrent_change_of_the_pool_is_kept(web: Arm) -> None:
    # GIVEN web-1's drain sets its entry Down between web-0's read of pool-http and its write
    web.fake.faults.append(
        Fault(
            "PUT",
            "backendAddressPools/pool-http",
            412,
            lambda fake: fake.change(POOL_HTTP, _set_state("member-1", "Down")),
        )
    )

    # WHEN web-0 is drained
    drain(by_admin_state(web), "web-0")

    # THEN both are Down: web-0's change was made again on a fresh read, not over web-1's
    assert admin_states(web.fake, POOL_HTTP) == {"member-0": "Down", "member-1": "Down"}


def test_a_drain_by_pool_edits_is_still_restored_after_the_method_changed(web: Arm) -> None:
    # GIVEN web-0 drained by pool edits (its NIC out of pool-http, its IP out of pool-ip)
    memento = _through_the_store(drain(web.balancer(method=POOL_EDIT), "web-0"))

    # WHEN the app, now draining by admin state, restores it
    by_admin_state(web).restore("web-0", memento)

    # THEN it is back in both pools as the pool-edit drain found it
    pools = web.fake.get(f"{ARM_ID}/networkInterfaces/web-0-nic")["properties"]["ipConfigurations"][0]["properties"]
    assert [pool["id"] for pool in pools["loadBalancerBackendAddressPools"]] == [POOL_HTTP]
    assert "web-0-addr" in admin_states(web.fake, POOL_IP)


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="admin-state"):
        AzureLoadBalancer(object(), SUB, RG, LB, lambda vm: [], method="admin")  # type: ignore[arg-type]


def test_the_setting_chooses_the_method_and_refuses_anything_else() -> None:
    base = {
        "MBRIDGE_EVENTS_TOPIC": "maintenance-events",
        "MBRIDGE_EVENTS_SUBSCRIPTION": "functions",
        "MBRIDGE_LB_SUBSCRIPTION_ID": SUB,
        "MBRIDGE_LB_RESOURCE_GROUP": RG,
        "MBRIDGE_LB_NAME": LB,
    }
    assert _target(base).drain_method == POOL_EDIT
    assert _target({**base, LB_DRAIN: "Admin-State"}).drain_method == ADMIN_STATE
    with pytest.raises(SettingsError, match=f"{LB_DRAIN} is pool-edit or admin-state"):
        _target({**base, LB_DRAIN: "down"})


def _target(environ: dict[str, str]) -> Any:
    from functions.azure_app.settings import _Env, _load_balancer

    return _load_balancer(_Env(environ))


def _set_state(entry_name: str, state: str) -> Callable[[JsonObject], None]:
    """An edit of a pool document: the named entry's admin state set (someone else's change)."""

    def edit(document: JsonObject) -> None:
        for entry in document["properties"]["loadBalancerBackendAddresses"]:
            if entry["name"] == entry_name:
                entry["properties"]["adminState"] = state

    return edit
