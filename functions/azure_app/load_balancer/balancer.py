"""`AzureLoadBalancer`: the LoadBalancer port over the backend pools of one Azure load balancer.

`locate` reads where a VM takes traffic, `remove` and `restore` edit exactly what the memento names,
each NIC or pool by read-modify-write with If-Match, again on a fresh read after a 412. How a VM is
taken out is the drain method: its pool memberships edited away (`pool-edit`), or its pool entries
set to admin state Down (`admin-state`, admin_state.py). The memento names the method's parts, so a
drain is restored by what it did whatever the method is by then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.mgmt.network import NetworkManagementClient

from functions.azure_app.load_balancer.admin_state import (
    Member,
    entries_of,
    member_of_nics,
    member_of_scale_set_instance,
    put_back,
    refuse_unprobed,
    set_down,
    unprobed_rules,
)
from functions.azure_app.load_balancer.arm import (
    PRECONDITION_FAILED,
    LoadBalancerUnavailableError,
    ResourceId,
    arm_errors,
    if_match,
)
from functions.azure_app.load_balancer.ip_pools import address_memento, addresses_of, holds, join_pool, leave_pool
from functions.azure_app.load_balancer.nic_pools import join_pools, leave_pools, parts_by_nic
from functions.core.ports import JsonObject
from functions.trust.verifiers import VmDirectory
from wire.errors import PermanentError

LOGGER = logging.getLogger("mbridge.functions.azure.load_balancer")

# A VM name → its NICs (azure-mgmt-network NetworkInterface models).
NicLookup = Callable[[str], Sequence[Any]]
# A VM name → its resource id when it is an instance of a uniform scale set (its NICs live inside the
# set, where no NIC lookup finds them), else None.
ScaleSetInstanceLookup = Callable[[str], "str | None"]

# The drain methods (MBRIDGE_LB_DRAIN).
POOL_EDIT = "pool-edit"
ADMIN_STATE = "admin-state"
DRAIN_METHODS = (POOL_EDIT, ADMIN_STATE)

# How long one NIC or pool update may run before the invocation gives up (and is redelivered).
LRO_TIMEOUT_SECONDS = 120.0
# Read-modify-write attempts on one resource when others keep changing it (412).
WRITE_ATTEMPTS = 3


def nics_in_resource_group(client: NetworkManagementClient, resource_group: str) -> NicLookup:
    """The NIC lookup by VM name over `network_interfaces.list(resource_group)` (one list per call),
    for trust `reporter-name`, which has no directory of the VMs: a VM of another resource group with
    the same name and a NIC here would be taken for it."""

    def lookup(vm: str) -> Sequence[Any]:
        suffix = f"/virtualmachines/{vm.lower()}"
        return [
            nic
            for nic in client.network_interfaces.list(resource_group)
            if nic.virtual_machine is not None and (nic.virtual_machine.id or "").lower().endswith(suffix)
        ]

    return lookup


def nics_of_scoped_vm(client: NetworkManagementClient, resource_group: str, directory: VmDirectory) -> NicLookup:
    """The NIC lookup by the VM's full resource id: the one VM the deployment's scope knows by that
    name (`VmDirectory.named`), never a NIC of another VM whose id merely ends in the same name (a
    sandbox VM of another resource group may have its NIC here)."""

    def lookup(vm: str) -> Sequence[Any]:
        records = directory.named(vm)
        if not records:
            return []
        if len(records) > 1:
            raise PermanentError(
                f"{len(records)} VMs of the deployment's scope are named {vm!r} ({records[0].resource_id}, "
                f"{records[1].resource_id}): narrow MBRIDGE_TRUST_RESOURCE_GROUPS or rename one"
            )
        record = records[0]
        wanted = record.resource_id.lower()
        if record.nic_ids:
            nics = _read_nics(client, resource_group, record.nic_ids)
        else:
            nics = list(client.network_interfaces.list(resource_group))
        # Checked on the NIC itself as it is now: a NIC the directory saw on this VM may have been
        # moved to another since.
        return [
            nic for nic in nics if nic.virtual_machine is not None and (nic.virtual_machine.id or "").lower() == wanted
        ]

    return lookup


def uniform_instances(directory: VmDirectory) -> ScaleSetInstanceLookup:
    """The resource id of the one VM of the scope named so when it is a uniform scale set's instance
    (`.../virtualMachineScaleSets/<set>/virtualMachines/<n>`); None for any other VM, and for a name
    several VMs share (the NIC lookup refuses those)."""

    def lookup(vm: str) -> str | None:
        records = directory.named(vm)
        if len(records) != 1:
            return None
        resource_id = records[0].resource_id
        lowered = resource_id.lower()
        if "/providers/microsoft.compute/virtualmachinescalesets/" in lowered and "/virtualmachines/" in lowered:
            return resource_id
        return None

    return lookup


def _read_nics(client: NetworkManagementClient, resource_group: str, nic_ids: Sequence[str]) -> list[Any]:
    """The NICs of `nic_ids` that live in `resource_group` (the only group the functions may edit),
    one GET each; a NIC deleted since the directory was read is left out."""
    nics = []
    for nic_id in nic_ids:
        if "/providers/microsoft.network/networkinterfaces/" not in nic_id.lower():
            LOGGER.warning("the VM directory named a NIC whose id is not a NIC's: %.200r", nic_id)
            continue
        parsed = ResourceId.parse(nic_id)
        if parsed.resource_group.lower() != resource_group.lower():
            continue
        try:
            nics.append(client.network_interfaces.get(parsed.resource_group, parsed.name))
        except ResourceNotFoundError:
            LOGGER.info("NIC %s was deleted after the VM directory was read", nic_id)
    return nics


class AzureLoadBalancer:
    """The VMs' memberships in the backend pools of ONE Azure load balancer (NIC-based and IP-based):
    `locate` reads them, `remove` takes a VM out of them, `restore` puts it back."""

    def __init__(
        self,
        network_client: NetworkManagementClient,
        subscription_id: str,
        resource_group: str,
        load_balancer_name: str,
        vm_nic_lookup: NicLookup,
        *,
        method: str = POOL_EDIT,
        scale_set_instance: ScaleSetInstanceLookup | None = None,
        lro_timeout: float = LRO_TIMEOUT_SECONDS,
    ) -> None:
        if method not in DRAIN_METHODS:
            raise ValueError(f"unknown drain method {method!r}: one of {', '.join(DRAIN_METHODS)}")
        self._method = method
        self._scale_set_instance = scale_set_instance
        self._client = network_client
        self._resource_group = resource_group
        self._name = load_balancer_name
        self._lookup = vm_nic_lookup
        self._lro_timeout = lro_timeout
        self._lb_id = (
            f"/subscriptions/{subscription_id}/resourceGroups/{resource_group}"
            f"/providers/Microsoft.Network/loadBalancers/{load_balancer_name}"
        )
        self._pool_prefix = f"{self._lb_id}/backendAddressPools/".lower()

    # ---- the port

    def locate(self, vm: str) -> JsonObject | None:
        if self._method == ADMIN_STATE:
            return self._locate_entries(vm)
        with arm_errors(f"the NICs of VM {vm!r}", "read"):
            nics = list(self._lookup(vm))
        if not nics:
            LOGGER.warning("no NIC of VM %s found: it is in no pool of load balancer %s", vm, self._name)
            return None
        memento: JsonObject = {}
        in_nic_pools: list[JsonObject] = []
        for nic in nics:
            for ipc in nic.ip_configurations or []:
                ours = [pool.id for pool in ipc.load_balancer_backend_address_pools or [] if self._is_ours(pool.id)]
                if ours:
                    in_nic_pools.append({"nic_id": nic.id, "ip_configuration": ipc.name, "pools": ours})
        if in_nic_pools:
            memento["nic"] = in_nic_pools
        addresses = addresses_of(nics)
        if addresses:
            with arm_errors(f"the backend pools of load balancer {self._name!r}", "read"):
                pools = list(self._client.load_balancer_backend_address_pools.list(self._resource_group, self._name))
            in_ip_pools = [
                {"pool_id": pool.id, "address": address_memento(entry)}
                for pool in pools
                for entry in pool.load_balancer_backend_addresses or []
                if holds(entry, addresses)
            ]
            if in_ip_pools:
                memento["ip"] = in_ip_pools
        return memento or None

    def _locate_entries(self, vm: str) -> JsonObject | None:
        """The VM's entries in the pools that serve a probed load-balancing rule (admin state)."""
        member = self._member(vm)
        if member is None:
            LOGGER.warning("no NIC of VM %s found: it is in no pool of load balancer %s", vm, self._name)
            return None
        with arm_errors(f"load balancer {self._name!r} and its backend pools", "read"):
            balancer = self._client.load_balancers.get(self._resource_group, self._name)
            pools = list(self._client.load_balancer_backend_address_pools.list(self._resource_group, self._name))
        parts: list[JsonObject] = []
        for pool in pools:
            entries = entries_of(pool, member)
            if not entries:
                continue
            serving, unprobed = unprobed_rules(balancer, str(pool.id))
            if unprobed:
                raise refuse_unprobed(self._name, str(pool.id), unprobed)
            if not serving:
                LOGGER.info("backend pool %s serves no load-balancing rule: %s left in it as it is", pool.id, vm)
                continue
            parts.extend(entries)
        return {"admin": parts} if parts else None

    def _member(self, vm: str) -> Member | None:
        instance = self._scale_set_instance(vm) if self._scale_set_instance is not None else None
        if instance is not None:
            return member_of_scale_set_instance(instance)
        with arm_errors(f"the NICs of VM {vm!r}", "read"):
            nics = list(self._lookup(vm))
        return member_of_nics(nics, addresses_of(nics)) if nics else None

    def remove(self, vm: str, memento: JsonObject) -> None:
        # A failure part way raises: the core has recorded the memento, so the redelivery calls
        # this again (what is already out is skipped) or `restore` puts back all of it.
        for nic_id, parts in parts_by_nic(memento).items():
            with arm_errors(f"NIC {nic_id}", "drain"):
                self._update_nic(nic_id, partial(leave_pools, parts=parts), "take out")
        for pool_id, addresses in self._held_by_pool(vm, memento, "drain").items():
            with arm_errors(f"backend pool {pool_id}", "drain"):
                self._update_pool(pool_id, partial(leave_pool, addresses=addresses), "take out")
        for pool_id, parts in _admin_parts_by_pool(memento).items():
            with arm_errors(f"backend pool {pool_id}", "drain"):
                self._update_pool(pool_id, partial(set_down, parts=parts), "set down")

    def restore(self, vm: str, memento: JsonObject) -> None:
        for nic_id, parts in parts_by_nic(memento).items():
            with arm_errors(f"NIC {nic_id}", "restore"):
                self._update_nic(nic_id, partial(join_pools, parts=parts), "put back")
        for pool_id, addresses in self._held_by_pool(vm, memento, "restore").items():
            with arm_errors(f"backend pool {pool_id}", "restore"):
                self._update_pool(pool_id, partial(join_pool, addresses=addresses), "put back")
        # An entry is set back whether or not the VM still holds its IP: left Down, it would keep a
        # VM that takes the IP over later out of service for good.
        for pool_id, parts in _admin_parts_by_pool(memento).items():
            with arm_errors(f"backend pool {pool_id}", "restore"):
                self._update_pool(pool_id, partial(put_back, parts=parts), "set back")

    def _held_by_pool(self, vm: str, memento: JsonObject, action: str) -> dict[str, list[JsonObject]]:
        """The memento's IP-based entries by pool id, keeping only the IPs the VM holds now.

        An IP of a deleted VM may be handed to another VM later: taking it out would drain that
        other VM, and putting it back would send traffic to it."""
        parts = memento.get("ip", [])
        if not parts:
            return {}
        with arm_errors(f"the NICs of VM {vm!r}", action):
            held = {ip for ip, _ in addresses_of(self._lookup(vm))}
        by_pool: dict[str, list[JsonObject]] = {}
        for part in parts:
            address = part["address"]
            if address["ip_address"] in held:
                by_pool.setdefault(part["pool_id"], []).append(address)
            else:
                LOGGER.warning("VM %s no longer holds %s: %s left as it is", vm, address["ip_address"], part["pool_id"])
        return by_pool

    # ---- read-modify-write

    def _update_nic(self, nic_id: str, edit: Callable[[Any], bool], verb: str) -> None:
        """Apply `edit` (True when it changed the NIC) to a fresh read of the NIC and PUT it, again on 412."""
        for _ in range(WRITE_ATTEMPTS):
            try:
                nic = self._get_nic(nic_id)
            except ResourceNotFoundError:
                LOGGER.warning("NIC %s is gone (its VM was deleted): nothing to %s", nic_id, verb)
                return
            if not edit(nic) or self._put_nic(nic):
                return
        raise self._contended(f"NIC {nic_id}")

    def _update_pool(self, pool_id: str, edit: Callable[[Any], bool], verb: str) -> None:
        """Apply `edit` (True when it changed the pool) to a fresh read of the pool and PUT it, again on 412."""
        for _ in range(WRITE_ATTEMPTS):
            try:
                pool = self._get_pool(ResourceId.parse(pool_id).name)
            except ResourceNotFoundError:
                LOGGER.warning("backend pool %s is gone: nothing to %s", pool_id, verb)
                return
            if not edit(pool) or self._put_pool(pool):
                return
        raise self._contended(f"backend pool {pool_id}")

    def _is_ours(self, pool_id: str | None) -> bool:
        return bool(pool_id) and str(pool_id).lower().startswith(self._pool_prefix)

    def _get_nic(self, nic_id: str) -> Any:
        where = ResourceId.parse(nic_id)
        return self._client.network_interfaces.get(where.resource_group, where.name)

    def _put_nic(self, nic: Any) -> bool:
        """PUT the NIC if nobody changed it since it was read; False when someone did (412)."""
        where = ResourceId.parse(nic.id)
        return self._put(
            lambda: self._client.network_interfaces.begin_create_or_update(
                where.resource_group, where.name, nic, headers=if_match(nic)
            ),
            f"NIC {nic.id}",
        )

    def _get_pool(self, name: str) -> Any:
        return self._client.load_balancer_backend_address_pools.get(self._resource_group, self._name, name)

    def _put_pool(self, pool: Any) -> bool:
        """PUT the pool if nobody changed it since it was read; False when someone did (412)."""
        return self._put(
            lambda: self._client.load_balancer_backend_address_pools.begin_create_or_update(
                self._resource_group, self._name, pool.name, pool, headers=if_match(pool)
            ),
            f"backend pool {pool.id}",
        )

    # ---- ARM plumbing

    def _put(self, start: Callable[[], Any], what: str) -> bool:
        try:
            poller = start()
        except HttpResponseError as exc:
            if exc.status_code == PRECONDITION_FAILED:
                LOGGER.info("%s changed since it was read; reading it again", what)
                return False
            raise
        self._wait(poller, what)
        return True

    def _wait(self, poller: Any, what: str) -> None:
        poller.result(timeout=self._lro_timeout)
        if not poller.done():
            raise LoadBalancerUnavailableError(
                f"the update of {what} is still running after {self._lro_timeout:.0f} s; retry later"
            )

    def _contended(self, what: str) -> LoadBalancerUnavailableError:
        return LoadBalancerUnavailableError(f"{what} kept changing during {WRITE_ATTEMPTS} attempts to update it")


def _admin_parts_by_pool(memento: JsonObject) -> dict[str, list[JsonObject]]:
    by_pool: dict[str, list[JsonObject]] = {}
    for part in memento.get("admin", []):
        by_pool.setdefault(part["pool_id"], []).append(part)
    return by_pool
