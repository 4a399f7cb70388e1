"""Autohealer safety for drains through the agent's /readyz on Azure (docs/azure.md#autohealers).

A scale set with automatic instance repairs replaces (or reimages, or restarts) an instance that its
Application Health extension reports unhealthy. If that extension probes the agent's readiness
(`/readyz` on its health port), a drain turns it unready on purpose and the scale set repairs the
VM: the maintenance becomes an outage. So before a VM is drained through /readyz, the probe its scale
set's repairs act on (read with the VM directory's listing of the scale sets: `VmRecord.repairs_probe`,
functions/azure_app/vm_directory.py) is compared with the agent's readiness, and a drain that would
fail it is refused (`ReadinessBalancer` raises `AutohealerConflictError`).

A load balancer's own health probe on /readyz is what a readiness drain is for: it is not checked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from functions.trust.verifiers import VmRecord

READINESS_PATH = "/readyz"
AGENT_HEALTH_PORT = 9797  # the agent's default --listen port (agent/health/server.py)


class NamedVms(Protocol):
    def named(self, name: str) -> Sequence[VmRecord]: ...


def scale_set_repairs(
    directory: NamedVms, *, path: str = READINESS_PATH, port: int = AGENT_HEALTH_PORT
) -> Callable[[str], str | None]:
    """The guard of `ReadinessBalancer`: why draining the VM through /readyz would get it repaired."""

    def conflict(vm: str) -> str | None:
        for record in directory.named(vm):
            probe = record.repairs_probe
            if probe is None:
                continue
            protocol, probed, probed_port = probe
            if probed.split("?", 1)[0] == path and (probed_port is None or probed_port == port):
                on = "an unnamed port" if probed_port is None else f"port {probed_port}"
                return (
                    f"the scale set of {vm} has automatic instance repairs on its Application Health extension "
                    f"({protocol} {probed} on {on}), which is the agent's readiness: draining {vm} would get it "
                    "repaired (replaced, reimaged or restarted). Point the extension at the agent's /healthz or "
                    "the application's own check, keep /readyz for the load balancer's probe "
                    "(docs/azure.md#autohealers)"
                )
        return None

    return conflict
