"""LoadBalancer on Azure Load Balancer backend pools (azure-mgmt-network).

Azure has two kinds of backend pool, and a VM is a member of each differently:

- NIC-based pools: membership is written on the VM's NIC; each ipConfiguration lists the pools
  it belongs to (`loadBalancerBackendAddressPools`). Removing takes the references to pools of
  the configured load balancer off the ipConfigurations and PUTs the NIC; references to other
  load balancers stay.
- IP-based pools: membership is written on the pool, as `loadBalancerBackendAddresses` entries
  holding an `ipAddress` (and the virtual network or subnet it lives in). Removing takes the
  entries holding the VM's private IPs off the pool and PUTs it.

A drain is `locate` (read only: where the VM takes traffic, as a memento the core records) and
then `remove` (take the VM out of exactly what the memento names); `restore` puts exactly that
back. Both writers are idempotent, so after a failure part way the redelivery just calls them
again with the recorded memento:

    {"nic": [{"nic_id": ..., "ip_configuration": "ipconfig1", "pools": [<pool id>, ...]}],
     "ip":  [{"pool_id": ..., "address": {"name": ..., "ip_address": ..., "virtual_network_id": ...}}]}

Each write is a read-modify-write carrying the resource's ETag as If-Match, so a concurrent
change (another VM drained from the same pool at the same moment) fails with 412; the change is
then made again on a fresh read instead of overwriting the other one. A resource that needs no
change is not written.

A VM's NICs are found by listing the NICs of a resource group (`network_interfaces.list`) and
keeping those whose `virtualMachine.id` ends with `/virtualMachines/<vm name>` (compared
case-insensitively, as ARM compares names). VMSS Uniform instances have no NICs of their own in a
resource group and are not found: drain those through the agents' /readyz instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
)
from azure.mgmt.network import NetworkManagementClient
from azure.mgmt.network.models import BackendAddressPool, LoadBalancerBackendAddress, SubResource

from functions.core.ports import JsonObject
from wire.errors import PermanentError, RetryableError

LOGGER = logging.getLogger("mbridge.functions.azure.load_balancer")

# A VM name → its NICs (azure-mgmt-network NetworkInterface models).
NicLookup = Callable[[str], Sequence[Any]]

# How long one NIC or pool update may run before the invocation gives up (and is redelivered).
LRO_TIMEOUT_SECONDS = 120.0
# Read-modify-write attempts on one resource when others keep changing it (412).
WRITE_ATTEMPTS = 3
PRECONDITION_FAILED = 412
ROLE_HINT = (
    "grant the function app's identity the custom role of docs/azure.md (networkInterfaces read/write, "
    "loadBalancers/backendAddressPools read/write/join, virtualNetworks join actions) on it"
)


class LoadBalancerUnavailableError(RetryableError):
    """ARM throttled, failed, or is still busy with the resource; the message is redelivered."""


class LoadBalancerConfigError(PermanentError):
    """The load balancer, a NIC or a pool is missing, or the identity may not change it."""


def nics_in_resource_group(client: NetworkManagementClient, resource_group: str) -> NicLookup:
    """The NIC lookup by VM name over `network_interfaces.list(resource_group)` (one list per call)."""

    def lookup(vm: str) -> Sequence[Any]:
        suffix = f"/virtualmachines/{vm.lower()}"
        return [
            nic
            for nic in client.network_interfaces.list(resource_group)
            if nic.virtual_machine is not None and (nic.virtual_machine.id or "").lower().endswith(suffix)
        ]

    return lookup


@dataclass(frozen=True)
class _ResourceId:
    resource_group: str
    name: str

    @classmethod
    def parse(cls, resource_id: str) -> _ResourceId:
        parts = resource_id.strip("/").split("/")
        lowered = [part.lower() for part in parts]
        try:
            group = parts[lowered.index("resourcegroups") + 1]
        except (ValueError, IndexError):
            raise LoadBalancerConfigError(f"{resource_id!r} is not an ARM resource id") from None
        return cls(group, parts[-1])


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
        lro_timeout: float = LRO_TIMEOUT_SECONDS,
    ) -> None:
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
        with self._errors(f"the NICs of VM {vm!r}", "read"):
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
        addresses = _addresses_of(nics)
        if addresses:
            with self._errors(f"the backend pools of load balancer {self._name!r}", "read"):
                pools = list(self._client.load_balancer_backend_address_pools.list(self._resource_group, self._name))
            in_ip_pools = [
                {"pool_id": pool.id, "address": _address_memento(entry)}
                for pool in pools
                for entry in pool.load_balancer_backend_addresses or []
                if _holds(entry, addresses)
            ]
            if in_ip_pools:
                memento["ip"] = in_ip_pools
        return memento or None

    def remove(self, vm: str, memento: JsonObject) -> None:
        # A failure part way raises: the core has recorded the memento, so the redelivery calls
        # this again (what is already out is skipped) or `restore` puts back all of it.
        for nic_id, parts in _parts_by_nic(memento).items():
            with self._errors(f"NIC {nic_id}", "drain"):
                self._update_nic(nic_id, partial(_leave_pools, parts=parts), "take out")
        for pool_id, addresses in self._held_by_pool(vm, memento, "drain").items():
            with self._errors(f"backend pool {pool_id}", "drain"):
                self._update_pool(pool_id, partial(_leave_pool, addresses=addresses), "take out")

    def restore(self, vm: str, memento: JsonObject) -> None:
        for nic_id, parts in _parts_by_nic(memento).items():
            with self._errors(f"NIC {nic_id}", "restore"):
                self._update_nic(nic_id, partial(_join_pools, parts=parts), "put back")
        for pool_id, addresses in self._held_by_pool(vm, memento, "restore").items():
            with self._errors(f"backend pool {pool_id}", "restore"):
                self._update_pool(pool_id, partial(_join_pool, addresses=addresses), "put back")

    def _held_by_pool(self, vm: str, memento: JsonObject, action: str) -> dict[str, list[JsonObject]]:
        """The memento's IP-based entries by pool id, keeping only the IPs the VM holds now.

        An IP of a deleted VM may be handed to another VM later: taking it out would drain that
        other VM, and putting it back would send traffic to it."""
        parts = memento.get("ip", [])
        if not parts:
            return {}
        with self._errors(f"the NICs of VM {vm!r}", action):
            held = {ip for ip, _ in _addresses_of(self._lookup(vm))}
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
                pool = self._get_pool(_ResourceId.parse(pool_id).name)
            except ResourceNotFoundError:
                LOGGER.warning("backend pool %s is gone: nothing to %s", pool_id, verb)
                return
            if not edit(pool) or self._put_pool(pool):
                return
        raise self._contended(f"backend pool {pool_id}")

    def _is_ours(self, pool_id: str | None) -> bool:
        return bool(pool_id) and str(pool_id).lower().startswith(self._pool_prefix)

    def _get_nic(self, nic_id: str) -> Any:
        where = _ResourceId.parse(nic_id)
        return self._client.network_interfaces.get(where.resource_group, where.name)

    def _put_nic(self, nic: Any) -> bool:
        """PUT the NIC if nobody changed it since it was read; False when someone did (412)."""
        where = _ResourceId.parse(nic.id)
        return self._put(
            lambda: self._client.network_interfaces.begin_create_or_update(
                where.resource_group, where.name, nic, headers=_if_match(nic)
            ),
            f"NIC {nic.id}",
        )

    def _get_pool(self, name: str) -> Any:
        return self._client.load_balancer_backend_address_pools.get(self._resource_group, self._name, name)

    def _put_pool(self, pool: Any) -> bool:
        """PUT the pool if nobody changed it since it was read; False when someone did (412)."""
        return self._put(
            lambda: self._client.load_balancer_backend_address_pools.begin_create_or_update(
                self._resource_group, self._name, pool.name, pool, headers=_if_match(pool)
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

    @contextmanager
    def _errors(self, what: str, action: str) -> Iterator[None]:
        try:
            yield
        except ClientAuthenticationError as exc:
            raise LoadBalancerConfigError(
                f"cannot {action} {what}: authentication to Azure Resource Manager failed; the function app needs "
                f"a managed identity (AZURE_CLIENT_ID selects a user-assigned one): {exc.message}"
            ) from exc
        except HttpResponseError as exc:
            raise _mapped(exc, what, action) from exc
        except AzureError as exc:  # no HTTP response: connection errors and timeouts
            raise LoadBalancerUnavailableError(
                f"cannot reach Azure Resource Manager to {action} {what}: {exc}"
            ) from exc


def _mapped(exc: HttpResponseError, what: str, action: str) -> Exception:
    status = exc.status_code or 0
    if status == 403:
        return LoadBalancerConfigError(f"not authorised to {action} {what}: {ROLE_HINT}: {exc.message}")
    if status == 404:
        return LoadBalancerConfigError(
            f"cannot {action} {what}: not found; check MBRIDGE_LB_SUBSCRIPTION_ID, MBRIDGE_LB_RESOURCE_GROUP, "
            f"MBRIDGE_LB_NAME and MBRIDGE_LB_NIC_RESOURCE_GROUP: {exc.message}"
        )
    # 409: ARM serialises writes to a NIC or pool ("AnotherOperationInProgress"); it passes.
    if status in (408, 409, 412, 429) or status >= 500:
        return LoadBalancerUnavailableError(f"cannot {action} {what} now (HTTP {status}): {exc.message}")
    return LoadBalancerConfigError(f"Azure Resource Manager refused to {action} {what} (HTTP {status}): {exc.message}")


def _if_match(resource: Any) -> dict[str, str]:
    etag = getattr(resource, "etag", None)
    return {"If-Match": etag} if etag else {}


def _parts_by_nic(memento: JsonObject) -> dict[str, list[JsonObject]]:
    by_nic: dict[str, list[JsonObject]] = {}
    for part in memento.get("nic", []):
        by_nic.setdefault(part["nic_id"], []).append(part)
    return by_nic


def _leave_pools(nic: Any, parts: list[JsonObject]) -> bool:
    """Take the memento's pool references off the NIC's ipConfigurations; True when any was there."""
    changed = False
    configurations = {ipc.name: ipc for ipc in nic.ip_configurations or []}
    for part in parts:
        ip_configuration = configurations.get(part["ip_configuration"])
        if ip_configuration is None:
            continue  # the ipConfiguration is gone, and its pool memberships with it
        pools = list(ip_configuration.load_balancer_backend_address_pools or [])
        named = {pool_id.lower() for pool_id in part["pools"]}
        kept = [pool for pool in pools if (pool.id or "").lower() not in named]
        if len(kept) < len(pools):
            ip_configuration.load_balancer_backend_address_pools = kept
            changed = True
    return changed


def _join_pools(nic: Any, parts: list[JsonObject]) -> bool:
    """Add the memento's pool references the NIC's ipConfigurations lack; True when any was missing."""
    changed = False
    configurations = {ipc.name: ipc for ipc in nic.ip_configurations or []}
    for part in parts:
        ip_configuration = configurations.get(part["ip_configuration"])
        if ip_configuration is None:
            LOGGER.warning("NIC %s has no ipConfiguration %s any more", nic.id, part["ip_configuration"])
            continue
        pools = list(ip_configuration.load_balancer_backend_address_pools or [])
        present = {(pool.id or "").lower() for pool in pools}
        missing = [pool_id for pool_id in part["pools"] if pool_id.lower() not in present]
        if missing:
            ip_configuration.load_balancer_backend_address_pools = pools + [
                BackendAddressPool(id=pool_id) for pool_id in missing
            ]
            changed = True
    return changed


def _leave_pool(pool: Any, addresses: list[JsonObject]) -> bool:
    """Take the IP-based entries holding the memento's IPs off the pool; True when any was there."""
    ips = {address["ip_address"] for address in addresses}
    entries = list(pool.load_balancer_backend_addresses or [])
    # NIC-based pools list their members too, read-only: those are left to the NIC.
    kept = [e for e in entries if not (e.ip_address in ips and e.network_interface_ip_configuration is None)]
    if len(kept) == len(entries):
        return False
    pool.load_balancer_backend_addresses = kept
    return True


def _join_pool(pool: Any, addresses: list[JsonObject]) -> bool:
    """Add the memento's entries whose IPs the pool lacks; True when any was missing."""
    entries = list(pool.load_balancer_backend_addresses or [])
    present = {entry.ip_address for entry in entries if entry.ip_address}
    missing = [address for address in addresses if address["ip_address"] not in present]
    if not missing:
        return False
    pool.load_balancer_backend_addresses = entries + [_address_from_memento(a) for a in missing]
    return True


def _addresses_of(nics: Iterable[Any]) -> list[tuple[str, str]]:
    """(private IP, subnet id) of every ipConfiguration of the NICs."""
    return [
        (ipc.private_ip_address, _id_of(ipc.subnet))
        for nic in nics
        for ipc in nic.ip_configurations or []
        if ipc.private_ip_address
    ]


def _holds(entry: Any, addresses: list[tuple[str, str]]) -> bool:
    """Whether a pool entry is an IP-based entry for one of the addresses, in the same network."""
    if not entry.ip_address or entry.network_interface_ip_configuration is not None:
        return False  # NIC-based pools list their members too, read-only
    network = _id_of(entry.virtual_network).lower()
    subnet = _id_of(entry.subnet).lower()
    for ip, subnet_id in addresses:
        if ip != entry.ip_address:
            continue
        where = subnet_id.lower()
        if (
            (network and where.startswith(f"{network}/subnets/"))
            or (subnet and where == subnet)
            or not (network or subnet)
        ):
            return True
    return False


def _id_of(reference: Any) -> str:
    return str(reference.id) if reference is not None and reference.id else ""


def _address_memento(entry: Any) -> JsonObject:
    memento: JsonObject = {"name": entry.name, "ip_address": entry.ip_address}
    for key, reference in (
        ("virtual_network_id", entry.virtual_network),
        ("subnet_id", entry.subnet),
        ("frontend_ip_configuration_id", entry.load_balancer_frontend_ip_configuration),
    ):
        if _id_of(reference):
            memento[key] = _id_of(reference)
    if entry.admin_state:
        memento["admin_state"] = str(entry.admin_state)
    return memento


def _address_from_memento(memento: JsonObject) -> LoadBalancerBackendAddress:
    address = LoadBalancerBackendAddress(name=memento.get("name"))
    address.ip_address = memento["ip_address"]
    if "virtual_network_id" in memento:
        address.virtual_network = SubResource(id=memento["virtual_network_id"])
    if "subnet_id" in memento:
        address.subnet = SubResource(id=memento["subnet_id"])
    if "frontend_ip_configuration_id" in memento:
        address.load_balancer_frontend_ip_configuration = SubResource(id=memento["frontend_ip_configuration_id"])
    if "admin_state" in memento:
        address.admin_state = memento["admin_state"]
    return address
