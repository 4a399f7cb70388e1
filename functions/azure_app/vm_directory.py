"""Which VM a vmId is: the name the functions act on, for the vmId an attested document names.

An Azure IMDS attested document names its VM by `vmId` (the GUID in the VM's `properties.vmId`)
and `subscriptionId`; Scheduled Events, the drains and the commands name VMs by resource name:
the VM's name, or `<scale set>_<instance id>` for an instance of a uniform scale set. Both classes
here are the `VmDirectory` of `functions.trust.verifiers`, which maps the one to the other;
`name_of` returns None for a vmId it cannot find.

Each VM is a `VmRecord`: its name, its full resource id (what the load balancer's NICs point at) and its
vmId. `named` answers every VM of the scope with a name, so that a name two VMs share (a sandbox VM
named like a production one) is refused rather than acted on.

`ComputeVmDirectory` reads Azure Resource Manager (azure-mgmt-compute) with the app's identity:

- per subscription, `virtual_machines.list_all()` (standalone VMs and the VMs of flexible scale
  sets, which are ordinary VMs) and, for every uniform scale set of
  `virtual_machine_scale_sets.list_all()`, `virtual_machine_scale_set_vms.list(group, name)`;
- or, with resource groups configured (MBRIDGE_TRUST_RESOURCE_GROUPS), the same lists in each of
  those groups only: cheaper, and the identity needs Reader on those groups only. A group that is
  not there (404) has no VMs and is skipped with a warning.

It keeps one vmId → name map per subscription. A vmId missing from the map refreshes it, at most
once per `min_refresh_seconds` (so a stream of reports from VMs it cannot see costs one listing a
minute, not one per report); any lookup after `max_age_seconds` refreshes it. A VM's name never
changes and a vmId is never given to another VM, so when a refresh due to age fails for a reason
that passes (throttling, a 5xx, no network), a vmId already in the map keeps its name and the
failed refresh is not tried again for `min_refresh_seconds`; a vmId not in it raises. Lookups run
on the host's invocation threads: a refresh holds a per-subscription lock, and lookups waiting
for it use its result instead of listing again.

Errors: a refused identity (401, 403) raises `VmDirectoryConfigError` (permanent) naming the role
to grant; throttling, 5xx and network errors raise `VmDirectoryUnavailableError` (retryable).
The role is the built-in Reader on the resource groups (or the subscription): the narrowest
built-in role with `Microsoft.Compute/virtualMachines/read`,
`Microsoft.Compute/virtualMachineScaleSets/read` and
`Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read` and no write, action or data
action (docs/azure.md, "Resolving a VM's identity").

`StaticVmDirectory` is a fixed `{subscription_id: {vm_id: name}}` for the local app and tests.

Nothing here imports an Azure SDK at import time, so the local app can use `StaticVmDirectory`
without them.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from functions.azure_app.settings import TRUST_RESOURCE_GROUPS, AttestedTrust
from functions.trust.verifiers import VmRecord
from wire.errors import PermanentError, RetryableError

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.core.exceptions import HttpResponseError

LOGGER = logging.getLogger("mbridge.functions.azure.vm_directory")

DEFAULT_MIN_REFRESH_SECONDS = 60.0
DEFAULT_MAX_AGE_SECONDS = 900.0
ROLE = "Reader"
_GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")

# A subscription id → a ComputeManagementClient (or anything with its three operation groups).
ClientFactory = Callable[[str], Any]


class VmDirectoryConfigError(PermanentError):
    """The identity may not list the VMs, or ARM refused the request as made."""


class VmDirectoryUnavailableError(RetryableError):
    """ARM throttled, failed or could not be reached; the message is redelivered."""


class StaticVmDirectory:
    """A fixed directory: `{subscription_id: {vm_id: name}}`, each VM in resource group `group`.
    Subscription ids and vmIds are compared case-insensitively; a vmId listed under one
    subscription is unknown in any other."""

    def __init__(
        self,
        names: Mapping[str, Mapping[str, str]],
        group: str = "vms",
        nic_ids: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """`nic_ids`: vmId → the NIC ids of the VM's network profile (none by default)."""
        nics = {vm_id.lower(): tuple(ids) for vm_id, ids in (nic_ids or {}).items()}
        self._records = {
            subscription.lower(): {
                vm_id.lower(): VmRecord(
                    name, vm_resource_id(subscription.lower(), group, name), vm_id.lower(), nics.get(vm_id.lower(), ())
                )
                for vm_id, name in vms.items()
            }
            for subscription, vms in names.items()
        }

    def resource_of(self, subscription_id: str, vm_id: str) -> VmRecord | None:
        return self._records.get(subscription_id.strip().lower(), {}).get(vm_id.strip().lower())

    def name_of(self, subscription_id: str, vm_id: str) -> str | None:
        record = self.resource_of(subscription_id, vm_id)
        return None if record is None else record.name

    def named(self, name: str) -> list[VmRecord]:
        return [r for vms in self._records.values() for r in vms.values() if r.name.lower() == name.lower()]


def vm_resource_id(subscription_id: str, group: str, name: str) -> str:
    """The resource id of a standalone VM."""
    return f"/subscriptions/{subscription_id}/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/{name}"


@dataclass(frozen=True)
class _Snapshot:
    names: dict[str, VmRecord]  # lower-case vmId → the VM
    loaded_at: float


@dataclass
class _Subscription:
    lock: threading.Lock = field(default_factory=threading.Lock)
    snapshot: _Snapshot | None = None
    failed_at: float | None = None  # when a refresh due to age last failed (names were served stale)


class ComputeVmDirectory:
    """vmId → VM name from the compute API, cached per subscription (see the module doc)."""

    def __init__(
        self,
        credential: TokenCredential | None = None,
        *,
        resource_groups: Sequence[str] = (),
        subscriptions: Sequence[str] = (),
        client_factory: ClientFactory | None = None,
        min_refresh_seconds: float = DEFAULT_MIN_REFRESH_SECONDS,
        max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if client_factory is None:
            if credential is None:
                raise ValueError("give a credential or a client factory")
            client_factory = _compute_clients(credential)
        if min_refresh_seconds < 0 or max_age_seconds < min_refresh_seconds:
            raise ValueError("0 <= min_refresh_seconds <= max_age_seconds")
        self._factory = client_factory
        self._groups = tuple(resource_groups)
        self._trusted = tuple(subscription.strip().lower() for subscription in subscriptions)
        self._min_refresh = min_refresh_seconds
        self._max_age = max_age_seconds
        self._clock = clock
        self._lock = threading.Lock()  # guards the two dicts below, never held while ARM is asked
        self._subscriptions: dict[str, _Subscription] = {}
        self._clients: dict[str, Any] = {}

    @property
    def resource_groups(self) -> tuple[str, ...]:
        """Where the VMs are listed in each subscription; empty: the whole subscription."""
        return self._groups

    def name_of(self, subscription_id: str, vm_id: str) -> str | None:
        record = self.resource_of(subscription_id, vm_id)
        return None if record is None else record.name

    def named(self, name: str) -> list[VmRecord]:
        """Every VM named `name` in the configured subscriptions (and any other looked up since),
        from maps no older than `max_age_seconds` (a listing where one is older or missing)."""
        with self._lock:
            subscriptions = sorted({*self._trusted, *self._subscriptions})
        found: list[VmRecord] = []
        for subscription in subscriptions:
            snapshot = self._fresh(subscription)
            found.extend(record for record in snapshot.names.values() if record.name.lower() == name.lower())
        return found

    def _fresh(self, subscription: str) -> _Snapshot:
        state = self._state(subscription)
        snapshot = state.snapshot
        if snapshot is not None and self._clock() - snapshot.loaded_at < self._max_age:
            return snapshot
        with state.lock:
            now = self._clock()
            snapshot = state.snapshot
            if snapshot is not None and now - snapshot.loaded_at < self._max_age:
                return snapshot
            if snapshot is not None and state.failed_at is not None and now - state.failed_at < self._min_refresh:
                return snapshot
            self._refresh(subscription, state, now, keep_stale=snapshot is not None)
            assert state.snapshot is not None
            return state.snapshot

    def resource_of(self, subscription_id: str, vm_id: str) -> VmRecord | None:
        subscription, key = subscription_id.strip().lower(), vm_id.strip().lower()
        if not _GUID.match(subscription) or not _GUID.match(key):
            LOGGER.warning("not a subscription id and vmId: %.40r %.40r; no VM has them", subscription_id, vm_id)
            return None
        state = self._state(subscription)
        decided, record = self._cached(state, key, self._clock())
        if decided:
            return record
        with state.lock:
            # Another invocation may have refreshed the map while this one waited for the lock.
            now = self._clock()
            decided, record = self._cached(state, key, now)
            if decided:
                return record
            stale = state.snapshot.names.get(key) if state.snapshot is not None else None
            if stale is not None and state.failed_at is not None and now - state.failed_at < self._min_refresh:
                return stale
            if not self._refresh(subscription, state, now, keep_stale=stale is not None):
                return stale
            assert state.snapshot is not None
            return state.snapshot.names.get(key)

    def _refresh(self, subscription: str, state: _Subscription, now: float, *, keep_stale: bool) -> bool:
        """List the subscription's VMs again (under `state.lock`): True when listed. A failure that
        passes keeps the map it has when `keep_stale` (False, not tried again for `min_refresh_seconds`)
        and raises otherwise."""
        try:
            state.snapshot, state.failed_at = self._load(subscription, now), None
            return True
        except VmDirectoryUnavailableError as exc:
            if not keep_stale:
                raise
            state.failed_at = now
            LOGGER.warning(
                "the VM list of subscription %s is out of date and cannot be read now: %s", subscription, exc
            )
            return False

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            close = getattr(client, "close", None)
            if close is not None:
                close()

    # ---- the cache

    def _state(self, subscription: str) -> _Subscription:
        with self._lock:
            return self._subscriptions.setdefault(subscription, _Subscription())

    def _cached(self, state: _Subscription, key: str, now: float) -> tuple[bool, VmRecord | None]:
        """(True, the answer) when the map may answer without a refresh; (False, None) otherwise."""
        snapshot = state.snapshot
        if snapshot is None or now - snapshot.loaded_at >= self._max_age:
            return False, None
        record = snapshot.names.get(key)
        if record is not None or now - snapshot.loaded_at < self._min_refresh:
            return True, record
        return False, None

    def _client(self, subscription: str) -> Any:
        with self._lock:
            client = self._clients.get(subscription)
            if client is None:
                client = self._clients[subscription] = self._factory(subscription)
            return client

    # ---- ARM

    def _load(self, subscription: str, now: float) -> _Snapshot:
        client = self._client(subscription)
        names: dict[str, VmRecord] = {}
        with self._errors(subscription):
            if self._groups:
                for group in self._groups:
                    self._read_group(client, subscription, group, names)
            else:
                self._read(
                    client, client.virtual_machines.list_all(), client.virtual_machine_scale_sets.list_all(), names
                )
        LOGGER.info("%d VMs in subscription %s%s", len(names), subscription, self._where())
        return _Snapshot(names, now)

    def _read_group(self, client: Any, subscription: str, group: str, names: dict[str, VmRecord]) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self._read(
                client, client.virtual_machines.list(group), client.virtual_machine_scale_sets.list(group), names
            )
        except ResourceNotFoundError:
            LOGGER.warning(
                "resource group %s of %s is not in subscription %s: it has no VMs",
                group,
                TRUST_RESOURCE_GROUPS,
                subscription,
            )

    def _read(self, client: Any, vms: Iterable[Any], scale_sets: Iterable[Any], names: dict[str, VmRecord]) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        scale_sets = list(scale_sets)
        # A flexible scale set's VMs name their set; the set says what its automatic repairs probe.
        repairs = {str(scale_set.id or "").lower(): repairs_probe(scale_set) for scale_set in scale_sets}
        for vm in vms:
            owner = getattr(getattr(vm, "virtual_machine_scale_set", None), "id", None)
            _add(names, vm, repairs.get(str(owner or "").lower()))
        for scale_set in scale_sets:
            # Scale sets made before orchestration modes existed have none: they are uniform.
            if _value(scale_set.orchestration_mode).lower() == "flexible":
                continue  # its VMs are ordinary VMs, listed above
            group = _resource_group_of(scale_set.id or "")
            if group is None or not scale_set.name:
                LOGGER.warning("ARM listed a scale set without a resource group or name: %.200r", scale_set.id)
                continue
            try:
                for instance in client.virtual_machine_scale_set_vms.list(group, scale_set.name):
                    _add(names, instance, repairs.get(str(scale_set.id or "").lower()))
            except ResourceNotFoundError:
                LOGGER.info("scale set %s was deleted while its instances were listed", scale_set.id)

    def _where(self) -> str:
        return f" (resource groups {', '.join(self._groups)})" if self._groups else ""

    def _role_hint(self, subscription: str) -> str:
        if self._groups:
            scope = f"the resource group(s) {', '.join(self._groups)} of subscription {subscription}"
        else:
            scope = f"subscription {subscription} (or set {TRUST_RESOURCE_GROUPS} and grant it on those groups only)"
        return f"grant the function app's identity the built-in role {ROLE} on {scope}"

    @contextmanager
    def _errors(self, subscription: str) -> Iterator[None]:
        from azure.core.exceptions import AzureError, ClientAuthenticationError, HttpResponseError

        what = f"the VMs of subscription {subscription}{self._where()}"
        try:
            yield
        except ClientAuthenticationError as exc:
            raise VmDirectoryConfigError(
                f"cannot list {what}: authentication to Azure Resource Manager failed; the function app needs a "
                f"managed identity (AZURE_CLIENT_ID selects a user-assigned one): {self._role_hint(subscription)}: "
                f"{exc.message}"
            ) from exc
        except HttpResponseError as exc:
            raise self._mapped(exc, what, subscription) from exc
        except AzureError as exc:  # no HTTP response: connection errors and timeouts
            raise VmDirectoryUnavailableError(f"cannot reach Azure Resource Manager to list {what}: {exc}") from exc

    def _mapped(self, exc: HttpResponseError, what: str, subscription: str) -> Exception:
        status = exc.status_code or 0
        if status in (401, 403):
            return VmDirectoryConfigError(
                f"not authorised to list {what} (HTTP {status}): {self._role_hint(subscription)}: {exc.message}"
            )
        if status in (408, 429) or status >= 500 or status < 400:
            return VmDirectoryUnavailableError(f"cannot list {what} now (HTTP {status}): {exc.message}")
        return VmDirectoryConfigError(f"Azure Resource Manager refused to list {what} (HTTP {status}): {exc.message}")


def vm_directory(trust: AttestedTrust, credential: TokenCredential) -> ComputeVmDirectory:
    """The directory of the deployment's scope the trust settings describe, on `credential` (the app's
    identity, or an operator's for `mbridge approve`)."""
    return ComputeVmDirectory(
        credential, resource_groups=trust.trust_resource_groups, subscriptions=trust.trust_subscriptions
    )


def _compute_clients(credential: TokenCredential) -> ClientFactory:
    def create(subscription: str) -> Any:
        from azure.mgmt.compute import ComputeManagementClient

        return ComputeManagementClient(credential, subscription)

    return create


def _add(names: dict[str, VmRecord], resource: Any, repairs: tuple[str, str, int | None] | None = None) -> None:
    vm_id, name, resource_id = resource.vm_id, resource.name, resource.id
    if vm_id and name and resource_id:
        names[str(vm_id).lower()] = VmRecord(
            str(name), str(resource_id), str(vm_id).lower(), _nic_ids(resource), repairs_probe=repairs
        )


APPLICATION_HEALTH = ("applicationhealthlinux", "applicationhealthwindows")


def repairs_probe(scale_set: Any) -> tuple[str, str, int | None] | None:
    """What a scale set's automatic instance repairs act on: its Application Health extension's
    protocol, request path and port (None: not given), when repairs are enabled; else None. A TCP
    probe reads no path: None too (it cannot be the agent's readiness)."""
    policy = getattr(scale_set, "automatic_repairs_policy", None)
    if not getattr(policy, "enabled", False):
        return None
    profile = getattr(getattr(scale_set, "virtual_machine_profile", None), "extension_profile", None)
    for extension in getattr(profile, "extensions", None) or ():
        # The SDK's models put the extension's own fields under `properties` (older ones flattened
        # them, with `type_properties_type`): read either.
        fields = getattr(extension, "properties", None) or extension
        kind = str(getattr(fields, "type", None) or getattr(extension, "type_properties_type", None) or "").lower()
        settings = getattr(fields, "settings", None)
        if kind not in APPLICATION_HEALTH or not isinstance(settings, Mapping):
            continue
        protocol = str(settings.get("protocol", "")).lower()
        if protocol not in ("http", "https"):
            return None
        port = settings.get("port")
        return protocol, str(settings.get("requestPath") or "/"), port if isinstance(port, int) else None
    return None


def _nic_ids(resource: Any) -> tuple[str, ...]:
    """The NIC ids of a VM's network profile: a drain then reads its NICs one by one instead of
    listing every NIC of the group (docs/scale.md: a list per drain grows a wave's reads with the
    square of the group)."""
    profile = getattr(resource, "network_profile", None)
    references = getattr(profile, "network_interfaces", None) or ()
    return tuple(str(reference.id) for reference in references if getattr(reference, "id", None))


def _value(mode: Any) -> str:
    """The text of an SDK enum (a str subclass whose str() is its Python name), or of a plain string."""
    return str(getattr(mode, "value", mode) or "")


def _resource_group_of(resource_id: str) -> str | None:
    parts = resource_id.strip("/").split("/")
    lowered = [part.lower() for part in parts]
    try:
        return parts[lowered.index("resourcegroups") + 1] or None
    except (ValueError, IndexError):
        return None
