"""Draining by Azure Load Balancer's per-backend **admin state**: the VM's entries stay in their pools
and are set `Down`, so the load balancer sends them no new connections whatever the probe says, and
established TCP connections are kept (Microsoft's "Administrative State (Admin State) in Azure Load
Balancer"). Restore sets each entry back to what it was.

A pool lists every member as a `loadBalancerBackendAddresses` entry, whatever its kind:

- NIC-based pools: the entry references the member's NIC ipConfiguration
  (`networkInterfaceIPConfiguration`), also for an instance of a uniform scale set, whose NIC lives
  inside the scale set (`.../virtualMachineScaleSets/<set>/virtualMachines/<n>/networkInterfaces/...`);
- IP-based pools: the entry holds the member's private IP (`ipAddress`) in a virtual network.

So a VM's entries are found without reading or writing its NICs, and uniform scale sets, which a
NIC edit cannot reach, are drained too. Each write is the pool's read-modify-write (If-Match), as for
pool edits.

Admin state only applies to load-balancing rules with a health probe (the page's limitations). A pool
that serves a rule without one would keep sending the VM new connections, so `locate` refuses it with
the rule named, before anything changes; a pool that serves no load-balancing rule (outbound rules
only) carries no inbound traffic and is left alone.

The memento's part, one element per entry set `Down`:

    {"admin": [{"pool_id": ..., "name": <entry name>, "ip_configuration_id" | "ip_address": ...,
                "was": "None" | "Up" | "Down"}]}
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from functions.azure_app.load_balancer.arm import LoadBalancerConfigError
from functions.azure_app.load_balancer.ip_pools import holds
from functions.core.ports import JsonObject

LOGGER = logging.getLogger("mbridge.functions.azure.load_balancer")

DOWN = "Down"
NONE = "None"
# What ARM answers for the property; anything else read is kept as `was` only if it is one of these.
STATES = {"none": NONE, "up": "Up", "down": DOWN}


@dataclass(frozen=True)
class Member:
    """How a VM shows in backend pools: the prefixes of its NIC ipConfiguration ids (lower case) and
    its (private IP, subnet id) pairs."""

    ip_configuration_prefixes: tuple[str, ...]
    addresses: tuple[tuple[str, str], ...]


def member_of_nics(nics: Iterable[Any], addresses: Sequence[tuple[str, str]]) -> Member:
    return Member(tuple(f"{str(nic.id).lower()}/ipconfigurations/" for nic in nics if nic.id), tuple(addresses))


def member_of_scale_set_instance(instance_id: str) -> Member:
    """A uniform scale set's instance: its NICs are `<instance id>/networkInterfaces/<name>`."""
    return Member((f"{instance_id.lower()}/networkinterfaces/",), ())


def entries_of(pool: Any, member: Member) -> list[JsonObject]:
    """The memento's parts for the member's entries in the pool (read only)."""
    parts: list[JsonObject] = []
    for entry in pool.load_balancer_backend_addresses or []:
        reference = _ip_configuration_id(entry)
        if reference:
            if not reference.lower().startswith(member.ip_configuration_prefixes):
                continue
            identity: JsonObject = {"ip_configuration_id": reference}
        elif holds(entry, list(member.addresses)):
            identity = {"ip_address": entry.ip_address}
        else:
            continue
        parts.append({"pool_id": pool.id, "name": entry.name, **identity, "was": state_of(entry)})
    return parts


def unprobed_rules(load_balancer: Any, pool_id: str) -> tuple[list[str], list[str]]:
    """(the load-balancing rules that send to the pool, those of them without a health probe)."""
    wanted = pool_id.lower()
    serving, unprobed = [], []
    for rule in load_balancer.load_balancing_rules or []:
        pools = [rule.backend_address_pool, *(rule.backend_address_pools or [])]
        if not any(pool is not None and str(pool.id or "").lower() == wanted for pool in pools):
            continue
        serving.append(str(rule.name))
        if rule.probe is None or not rule.probe.id:
            unprobed.append(str(rule.name))
    return serving, unprobed


def refuse_unprobed(load_balancer_name: str, pool_id: str, rules: list[str]) -> LoadBalancerConfigError:
    return LoadBalancerConfigError(
        f"backend pool {pool_id} of load balancer {load_balancer_name!r} serves load-balancing rule(s) "
        f"{', '.join(rules)} without a health probe, where admin state does not apply: the VM would keep "
        "receiving new connections. Give those rules a health probe, or drain by pool edits "
        "(MBRIDGE_LB_DRAIN=pool-edit, with the pool-edit role of docs/azure.md)"
    )


def set_down(pool: Any, parts: list[JsonObject]) -> bool:
    """Set the parts' entries of the pool as read to Down; True when any was not Down yet."""
    changed = False
    for part in parts:
        entry = _entry(pool, part)
        if entry is not None and state_of(entry) != DOWN:
            entry.admin_state = DOWN
            changed = True
    return changed


def put_back(pool: Any, parts: list[JsonObject]) -> bool:
    """Set each entry the drain set Down back to what it was; True when any changed.

    An entry that is no longer Down was changed by someone else since (an operator brought it up):
    it is left as they set it. An entry that is gone (the VM left the pool) is skipped."""
    changed = False
    for part in parts:
        entry = _entry(pool, part)
        if entry is None:
            continue
        was = STATES.get(str(part.get("was", NONE)).lower(), NONE)
        if state_of(entry) == was:
            continue  # put back already (a redelivered restore)
        if state_of(entry) != DOWN:
            LOGGER.warning(
                "entry %s of %s is %s, not Down: someone changed it since the drain; left as it is",
                part.get("name"), part["pool_id"], state_of(entry),
            )  # fmt: skip
            continue
        entry.admin_state = was
        changed = True
    return changed


def state_of(entry: Any) -> str:
    """The entry's admin state as ARM spells it; an entry without one is `None` (the probe decides)."""
    value = getattr(entry.admin_state, "value", entry.admin_state)
    return STATES.get(str(value or NONE).lower(), NONE)


def _entry(pool: Any, part: JsonObject) -> Any:
    """The pool's entry the part names: same name AND same member, so an entry re-created under the
    name for another NIC or IP is never touched."""
    for entry in pool.load_balancer_backend_addresses or []:
        if entry.name != part.get("name"):
            continue
        reference = _ip_configuration_id(entry)
        if "ip_configuration_id" in part and reference.lower() == str(part["ip_configuration_id"]).lower():
            return entry
        if "ip_address" in part and not reference and entry.ip_address == part["ip_address"]:
            return entry
    LOGGER.warning(
        "backend pool %s has no entry %s of the VM any more: nothing to change", part["pool_id"], part.get("name")
    )
    return None


def _ip_configuration_id(entry: Any) -> str:
    reference = entry.network_interface_ip_configuration
    return str(reference.id) if reference is not None and reference.id else ""
