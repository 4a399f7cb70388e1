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
resource group and are not found by pool edits: drain those by admin state or through the agents'
/readyz instead.

With the drain method `admin-state` (MBRIDGE_LB_DRAIN) the VM stays in its pools and its entries
are set to admin state Down instead (admin_state.py): no NIC is written, and the instances of
uniform scale sets, whose entries reference NICs inside the set, are drained too.

The modules: arm (ids, If-Match, ARM's errors), nic_pools and ip_pools (the edits of each kind of
pool), admin_state (the entries' admin state), balancer (`AzureLoadBalancer` and the NIC lookup).
The names the wiring and the tests use are exported here.
"""

from __future__ import annotations

from functions.azure_app.load_balancer.arm import LoadBalancerConfigError, LoadBalancerUnavailableError
from functions.azure_app.load_balancer.balancer import (
    ADMIN_STATE,
    DRAIN_METHODS,
    LRO_TIMEOUT_SECONDS,
    POOL_EDIT,
    WRITE_ATTEMPTS,
    AzureLoadBalancer,
    NicLookup,
    nics_in_resource_group,
    nics_of_scoped_vm,
    uniform_instances,
)

__all__ = [
    "ADMIN_STATE",
    "DRAIN_METHODS",
    "LRO_TIMEOUT_SECONDS",
    "POOL_EDIT",
    "WRITE_ATTEMPTS",
    "AzureLoadBalancer",
    "LoadBalancerConfigError",
    "LoadBalancerUnavailableError",
    "NicLookup",
    "nics_in_resource_group",
    "nics_of_scoped_vm",
    "uniform_instances",
]
