"""LoadBalancer on Azure Load Balancer backend pools (azure-mgmt-network).

Azure has two kinds of backend pool, and a VM leaves each differently:

- NIC-based pools: membership is written on the VM's NIC; each ipConfiguration lists the pools
  it belongs to (`loadBalancerBackendAddressPools`). Draining removes the references to pools of
  the configured load balancer from the ipConfigurations and PUTs the NIC; references to other
  load balancers stay.
- IP-based pools: membership is written on the pool, as `loadBalancerBackendAddresses` entries
  holding an `ipAddress` (and the virtual network or subnet it lives in). Draining removes the
  entries holding the VM's private IPs and PUTs the pool.

Each write is a read-modify-write carrying the resource's ETag as If-Match, so a concurrent
change (another VM drained from the same pool at the same moment) fails with 412; the change is
then made again on a fresh read instead of overwriting the other one.

The memento says exactly what was removed, and `restore` puts exactly that back:

    {"nic": [{"nic_id": ..., "ip_configuration": "ipconfig1", "pools": [<pool id>, ...]}],
     "ip":  [{"pool_id": ..., "address": {"name": ..., "ip_address": ..., "virtual_network_id": ...}}]}

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
from typing import Any

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
)
from azure.mgmt.network import NetworkManagementClient
from azure.mgmt.network.models import BackendAddressPool, LoadBalancerBackendAddress, SubResource

from functions.core.errors import PermanentError, RetryableError
from functions.core.ports import JsonObject

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
    """Drains VMs from the backend pools of ONE Azure load balancer (NIC-based and IP-based)."""

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

    def drain(self, vm: str) -> JsonObject | None:
        with self._errors(f"the NICs of VM {vm!r}", "drain"):
            nics = list(self._lookup(vm))
        if not nics:
            LOGGER.warning("no NIC of VM %s found: it is in no pool of load balancer %s", vm, self._name)
            return None
        done: dict[str, list[JsonObject]] = {"nic": [], "ip": []}
        try:
            for nic in nics:
                with self._errors(f"NIC {nic.id}", "drain"):
                    done["nic"].extend(self._drain_nic(nic))
            with self._errors(f"the backend pools of load balancer {self._name!r}", "drain"):
                self._drain_addresses(_addresses_of(nics), done["ip"])
        except Exception:
            # The core records a drain only when this returns: undo the half that was done, or
            # nobody would ever put it back (the redelivery finds the VM already out of it).
            self._undo(vm, done)
            raise
        memento: JsonObject = {kind: parts for kind, parts in done.items() if parts}
        return memento or None

    def _undo(self, vm: str, done: dict[str, list[JsonObject]]) -> None:
        partial: JsonObject = {kind: parts for kind, parts in done.items() if parts}
        if not partial:
            return
        try:
            self.restore(vm, partial)
        except Exception:
            LOGGER.exception("could not undo the partial drain of %s; put this back by hand: %s", vm, partial)

    def restore(self, vm: str, memento: JsonObject) -> None:
        by_nic: dict[str, list[JsonObject]] = {}
        for part in memento.get("nic", []):
            by_nic.setdefault(part["nic_id"], []).append(part)
        for nic_id, parts in by_nic.items():
            with self._errors(f"NIC {nic_id}", "restore"):
                self._restore_nic(nic_id, parts)
        by_pool: dict[str, list[JsonObject]] = {}
        for part in memento.get("ip", []):
            by_pool.setdefault(part["pool_id"], []).append(part["address"])
        if by_pool:
            with self._errors(f"the backend pools of load balancer {self._name!r}", "restore"):
                self._restore_addresses(vm, by_pool)

    # ---- NIC-based pools

    def _drain_nic(self, nic: Any) -> list[JsonObject]:
        nic_id: str = nic.id
        for attempt in range(WRITE_ATTEMPTS):
            if attempt:
                nic = self._get_nic(nic_id)
            removed: list[JsonObject] = []
            for ip_configuration in nic.ip_configurations or []:
                pools = list(ip_configuration.load_balancer_backend_address_pools or [])
                ours = [pool.id for pool in pools if self._is_ours(pool.id)]
                if ours:
                    ip_configuration.load_balancer_backend_address_pools = [
                        pool for pool in pools if not self._is_ours(pool.id)
                    ]
                    removed.append({"nic_id": nic_id, "ip_configuration": ip_configuration.name, "pools": ours})
            if not removed:
                return []
            if self._put_nic(nic):
                return removed
        raise self._contended(f"NIC {nic_id}")

    def _restore_nic(self, nic_id: str, parts: list[JsonObject]) -> None:
        for _ in range(WRITE_ATTEMPTS):
            try:
                nic = self._get_nic(nic_id)
            except ResourceNotFoundError:
                LOGGER.warning("NIC %s is gone (its VM was deleted): nothing to put back", nic_id)
                return
            changed = False
            configurations = {ipc.name: ipc for ipc in nic.ip_configurations or []}
            for part in parts:
                ip_configuration = configurations.get(part["ip_configuration"])
                if ip_configuration is None:
                    LOGGER.warning("NIC %s has no ipConfiguration %s any more", nic_id, part["ip_configuration"])
                    continue
                pools = list(ip_configuration.load_balancer_backend_address_pools or [])
                present = {(pool.id or "").lower() for pool in pools}
                missing = [pool_id for pool_id in part["pools"] if pool_id.lower() not in present]
                if missing:
                    ip_configuration.load_balancer_backend_address_pools = pools + [
                        BackendAddressPool(id=pool_id) for pool_id in missing
                    ]
                    changed = True
            if not changed or self._put_nic(nic):
                return
        raise self._contended(f"NIC {nic_id}")

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

    def _is_ours(self, pool_id: str | None) -> bool:
        return bool(pool_id) and str(pool_id).lower().startswith(self._pool_prefix)

    # ---- IP-based pools

    def _drain_addresses(self, addresses: list[tuple[str, str]], removed: list[JsonObject]) -> None:
        """Drain the addresses from every IP-based pool, adding to `removed` pool by pool."""
        if not addresses:
            return
        for pool in self._client.load_balancer_backend_address_pools.list(self._resource_group, self._name):
            removed.extend(self._drain_pool(pool, addresses))

    def _drain_pool(self, pool: Any, addresses: list[tuple[str, str]]) -> list[JsonObject]:
        for attempt in range(WRITE_ATTEMPTS):
            if attempt:
                pool = self._get_pool(pool.name)
            entries = list(pool.load_balancer_backend_addresses or [])
            matched = [index for index, entry in enumerate(entries) if _holds(entry, addresses)]
            if not matched:
                return []
            pool.load_balancer_backend_addresses = [e for i, e in enumerate(entries) if i not in matched]
            if self._put_pool(pool):
                return [{"pool_id": pool.id, "address": _address_memento(entries[i])} for i in matched]
        raise self._contended(f"backend pool {pool.id}")

    def _restore_addresses(self, vm: str, by_pool: dict[str, list[JsonObject]]) -> None:
        # An IP of a deleted VM may be handed to another VM later: put back only the IPs the VM holds.
        current = {ip for ip, _ in _addresses_of(self._lookup(vm))}
        for pool_id, addresses in by_pool.items():
            wanted = [address for address in addresses if address["ip_address"] in current]
            for address in addresses:
                if address["ip_address"] not in current:
                    LOGGER.warning("VM %s no longer holds %s: not put back into %s", vm, address["ip_address"], pool_id)
            if wanted:
                self._restore_pool(pool_id, wanted)

    def _restore_pool(self, pool_id: str, addresses: list[JsonObject]) -> None:
        for _ in range(WRITE_ATTEMPTS):
            try:
                pool = self._get_pool(_ResourceId.parse(pool_id).name)
            except ResourceNotFoundError:
                LOGGER.warning("backend pool %s is gone: nothing to put back", pool_id)
                return
            entries = list(pool.load_balancer_backend_addresses or [])
            present = {entry.ip_address for entry in entries if entry.ip_address}
            missing = [address for address in addresses if address["ip_address"] not in present]
            if not missing:
                return
            pool.load_balancer_backend_addresses = entries + [_address_from_memento(a) for a in missing]
            if self._put_pool(pool):
                return
        raise self._contended(f"backend pool {pool_id}")

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
