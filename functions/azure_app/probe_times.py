"""How long the configured Azure load balancer (MBRIDGE_LB_*) takes to see a VM unready after a drain
through its agent's /readyz (docs/azure.md#probe-times, docs/policy.md#probe-aware-drains): the
reader `ReadinessBalancer` is given.

Which memberships count: those a readiness drain is what ends. An instance of a uniform scale set
(`<scale set>_<instance id>`) is in the load balancer's pools through the scale set's own NIC
configurations, which the pool edit (functions/azure_app/load_balancer) never finds: its /readyz
is what takes it out. A VM whose NIC or IP the pool edit finds is out of every pool of this load
balancer when that edit returns: no probe of it counts, and its answer is None.

What is read, with the function app's identity: the load balancer (`load_balancers.get`,
`Microsoft.Network/loadBalancers/read`), kept for `TTL_SECONDS`. Its backend pools list the NIC
configurations they hold (`backendIPConfigurations`); its load-balancing rules name their pools and
probe. A probe of the agent's readiness (Http or Https on `/readyz` at its health port) takes
`intervalInSeconds` x `probeThreshold` (`numberOfProbes` when the probe has no threshold) to see a
backend down; the longest over the rules of the VM's pools is the answer. A probe of anything else
(Tcp, another path or port) does not see the drain and does not count.

No answer (None: the policy's `readiness_probe_seconds` is used) for a VM no pool holds that way, or
when a probe of the readiness lacks its interval or threshold.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from azure.core.exceptions import AzureError, ClientAuthenticationError, HttpResponseError

from functions.azure_app.autohealer import AGENT_HEALTH_PORT, READINESS_PATH
from functions.azure_app.settings import LoadBalancerTarget, Settings
from wire.errors import PermanentError, RetryableError

LOGGER = logging.getLogger("mbridge.functions.azure.probe_times")

TTL_SECONDS = 600.0
READ_PERMISSION = "Microsoft.Network/loadBalancers/read"
# A uniform scale set's instance, as Scheduled Events name it (VmRecord.name).
_INSTANCE = re.compile(r"^(?P<scale_set>.+)_(?P<instance>\d+)$")


class LoadBalancerProbeTimes:
    """`seconds(vm)`: the probe's time of the load balancer's rules over the pools that hold the VM as
    a uniform scale set's instance, or None."""

    def __init__(
        self,
        network_client: Any,
        target: LoadBalancerTarget,
        *,
        path: str = READINESS_PATH,
        port: int = AGENT_HEALTH_PORT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = network_client
        self._target = target
        self._path, self._port = path, port
        self._clock = clock
        self._kept: tuple[float, Any] | None = None
        self._lock = threading.Lock()

    def seconds(self, vm: str) -> float | None:
        instance = _INSTANCE.match(vm)
        if instance is None:
            return None  # not a uniform scale set's instance: the pool edit takes it out, if anything
        marker = f"/virtualmachinescalesets/{instance['scale_set']}/virtualmachines/{instance['instance']}/".lower()
        balancer = self._balancer()
        pools = {
            _id(pool)
            for pool in balancer.backend_address_pools or []
            if any(marker in _id(configuration) for configuration in pool.backend_ip_configurations or [])
        }
        probes = {_id(probe): probe for probe in balancer.probes or []}
        found: list[float] = []
        for rule in balancer.load_balancing_rules or []:
            probe = probes.get(_id(rule.probe)) if rule.probe is not None else None
            if probe is None or not pools & _pools_of(rule) or not self._on_readiness(probe):
                continue
            seconds = _detection(probe)
            if seconds is None:
                LOGGER.info(
                    "probe %s of load balancer %s has no interval or threshold: %s counts with the policy's "
                    "readiness_probe_seconds",
                    probe.name,
                    self._target.name,
                    vm,
                )
                return None
            found.append(seconds)
        return max(found, default=None)

    def _on_readiness(self, probe: Any) -> bool:
        protocol = str(getattr(probe.protocol, "value", probe.protocol) or "").lower()
        path = str(probe.request_path or "").split("?", 1)[0]
        return protocol in ("http", "https") and path == self._path and probe.port == self._port

    def _balancer(self) -> Any:
        now = self._clock()
        with self._lock:
            if self._kept is not None and now - self._kept[0] < TTL_SECONDS:
                return self._kept[1]
        target = self._target
        with _read_errors(target):
            balancer = self._client.load_balancers.get(target.resource_group, target.name)
        with self._lock:
            self._kept = (now, balancer)
        return balancer


def probe_reader(settings: Settings, network_client: Any) -> Callable[[str], float | None] | None:
    """The reader of the readiness drain: of the configured load balancer, unless MBRIDGE_READ_PROBES
    is off (or no load balancer is configured)."""
    if settings.load_balancer is None or not settings.read_probes:
        return None
    times = LoadBalancerProbeTimes(network_client, settings.load_balancer, port=settings.agent_health_port)
    return times.seconds


def _pools_of(rule: Any) -> set[str]:
    pools = [rule.backend_address_pool, *(rule.backend_address_pools or [])]
    return {_id(pool) for pool in pools if pool is not None}


def _detection(probe: Any) -> float | None:
    interval = probe.interval_in_seconds or 0
    threshold = probe.probe_threshold or probe.number_of_probes or 0
    return float(interval * threshold) if interval > 0 and threshold > 0 else None


def _id(resource: Any) -> str:
    return str(resource.id or "").lower()


@contextmanager
def _read_errors(target: LoadBalancerTarget) -> Iterator[None]:
    what = f"load balancer {target.name} of resource group {target.resource_group}"
    try:
        yield
    except ClientAuthenticationError as exc:
        raise PermanentError(f"cannot read {what}: authentication to Azure Resource Manager failed: {exc}") from exc
    except HttpResponseError as exc:
        if exc.status_code in (403, 404):
            raise PermanentError(
                f"cannot read {what} (HTTP {exc.status_code}): grant the function app's identity {READ_PERMISSION} "
                f"on it (the drainer role of docs/azure.md carries it), and check MBRIDGE_LB_*: {exc.message}"
            ) from exc
        raise RetryableError(f"cannot read {what} now (HTTP {exc.status_code}): {exc.message}") from exc
    except AzureError as exc:
        raise RetryableError(f"cannot reach Azure Resource Manager to read {what}: {exc}") from exc
