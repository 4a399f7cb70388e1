"""IP-based backend pools: membership is written on the pool, as `loadBalancerBackendAddresses`
entries holding an `ipAddress` (and the virtual network or subnet it lives in).

Which entries hold a VM's private IPs, how an entry is recorded in the memento and rebuilt from it,
and the edits of one pool as read: take the entries off, or put them back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from azure.mgmt.network.models import LoadBalancerBackendAddress, SubResource

from functions.core.ports import JsonObject


def leave_pool(pool: Any, addresses: list[JsonObject]) -> bool:
    """Take the IP-based entries holding the memento's IPs off the pool; True when any was there."""
    ips = {address["ip_address"] for address in addresses}
    entries = list(pool.load_balancer_backend_addresses or [])
    # NIC-based pools list their members too, read-only: those are left to the NIC.
    kept = [e for e in entries if not (e.ip_address in ips and e.network_interface_ip_configuration is None)]
    if len(kept) == len(entries):
        return False
    pool.load_balancer_backend_addresses = kept
    return True


def join_pool(pool: Any, addresses: list[JsonObject]) -> bool:
    """Add the memento's entries whose IPs the pool lacks; True when any was missing."""
    entries = list(pool.load_balancer_backend_addresses or [])
    present = {entry.ip_address for entry in entries if entry.ip_address}
    missing = [address for address in addresses if address["ip_address"] not in present]
    if not missing:
        return False
    pool.load_balancer_backend_addresses = entries + [_address_from_memento(a) for a in missing]
    return True


def addresses_of(nics: Iterable[Any]) -> list[tuple[str, str]]:
    """(private IP, subnet id) of every ipConfiguration of the NICs."""
    return [
        (ipc.private_ip_address, _id_of(ipc.subnet))
        for nic in nics
        for ipc in nic.ip_configurations or []
        if ipc.private_ip_address
    ]


def holds(entry: Any, addresses: list[tuple[str, str]]) -> bool:
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


def address_memento(entry: Any) -> JsonObject:
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
