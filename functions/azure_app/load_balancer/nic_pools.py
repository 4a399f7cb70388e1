"""NIC-based backend pools: membership is written on the VM's NIC, where each ipConfiguration lists
the pools it belongs to (`loadBalancerBackendAddressPools`).

The edits of one NIC as read: take the memento's pool references off, or put them back.
"""

from __future__ import annotations

import logging
from typing import Any

from azure.mgmt.network.models import BackendAddressPool

from functions.core.ports import JsonObject

LOGGER = logging.getLogger("mbridge.functions.azure.load_balancer")


def parts_by_nic(memento: JsonObject) -> dict[str, list[JsonObject]]:
    by_nic: dict[str, list[JsonObject]] = {}
    for part in memento.get("nic", []):
        by_nic.setdefault(part["nic_id"], []).append(part)
    return by_nic


def leave_pools(nic: Any, parts: list[JsonObject]) -> bool:
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


def join_pools(nic: Any, parts: list[JsonObject]) -> bool:
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
