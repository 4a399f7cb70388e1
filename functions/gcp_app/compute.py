"""Compute Engine adapters (google-cloud-compute): unmanaged instance groups as the LoadBalancer
port, and instances.performMaintenance as the Maintenance port.

Draining is two steps. `locate` lists the configured unmanaged instance groups and returns the
memento of those that list the VM (and its instance URL), changing nothing; the core records it,
and only then `remove` takes the VM out of them, so a crash part way never loses what to put
back. A backend service then stops sending the VM new requests (after its connection-draining
timeout for open ones). `restore` adds the VM back to exactly the groups of the memento — never to
a group it was not taken out of by this system.

`remove` and `restore` are idempotent, because a redelivered message repeats them: both first
list the group's members and only change what is not yet as wanted.

Which instance a VM name stands for is the `InstanceDirectory`'s answer: the one instance of the
trusted projects (and zones) with that name, the same one the report's identity token was
verified against. A group member is that instance only when its URL names the instance's project,
zone and name, and performMaintenance is asked of that project and zone; a name carried by
several instances of the scope is refused, never guessed.

Long-running operations are awaited with zoneOperations.wait on a client of our own. The
library's built-in poller (`ExtendedOperation.result()`) builds its own operations client that
ignores the `client_options` of the client it came from.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import requests
from google.api_core import exceptions as api_errors
from google.auth import exceptions as auth_errors
from google.cloud import compute_v1

from functions.core.ports import JsonObject
from functions.gcp_app.settings import (
    ENV_INSTANCE_GROUPS,
    ENV_MAINTENANCE_ZONES,
    ENV_TRUST_PROJECTS,
    ENV_TRUST_ZONES,
    GroupRef,
)
from functions.trust.gce_instances import GceInstance, InstanceDirectory
from wire.errors import BridgeError, PermanentError, RetryableError

LOG = logging.getLogger("mbridge.gcp.compute")

MEMENTO_KEY = "instance_groups"
LIST_PERMISSION = "compute.instanceGroups.list"
UPDATE_PERMISSION = "compute.instanceGroups.update"
OPERATIONS_PERMISSION = "compute.zoneOperations.get"
MAINTENANCE_PERMISSION = "compute.instances.performMaintenance"

RETRYABLE_ERRORS = (
    api_errors.ServiceUnavailable,
    api_errors.DeadlineExceeded,
    api_errors.GatewayTimeout,
    api_errors.TooManyRequests,
    api_errors.ResourceExhausted,
    api_errors.InternalServerError,
    api_errors.BadGateway,
    auth_errors.TransportError,  # no token: the metadata server could not be reached
    requests.ConnectionError,  # the REST transport's own network failures
    requests.Timeout,
)
CREDENTIAL_ERRORS = (
    api_errors.Unauthorized,
    api_errors.Unauthenticated,
    auth_errors.DefaultCredentialsError,
    auth_errors.RefreshError,
)


class ComputeUnavailableError(RetryableError):
    """The Compute Engine API failed for now; the message is redelivered and the step repeated."""


class ComputeConfigError(PermanentError):
    """The Compute Engine API refused for a reason retrying cannot fix; the message says what to change."""


@contextmanager
def compute_errors(action: str, resource: str, permission: str) -> Iterator[None]:
    """Translate library and network errors, naming the resource and the permission concerned."""
    try:
        yield
    except BridgeError:
        raise
    except api_errors.Forbidden as error:  # PermissionDenied (gRPC) is a Forbidden (HTTP 403)
        raise ComputeConfigError(
            f"not allowed to {action} {resource}: grant the function's service account a role with {permission} "
            f"on it (docs/gcp.md, IAM): {error}"
        ) from error
    except api_errors.NotFound as error:
        raise ComputeConfigError(
            f"{resource} was not found while trying to {action}: check {ENV_INSTANCE_GROUPS}, "
            f"{ENV_MAINTENANCE_ZONES} and MBRIDGE_GCP_PROJECT: {error}"
        ) from error
    except CREDENTIAL_ERRORS as error:
        raise ComputeConfigError(
            f"Google credentials were missing or rejected while trying to {action} {resource}: attach a service "
            f"account to the function: {error}"
        ) from error
    except RETRYABLE_ERRORS as error:
        raise ComputeUnavailableError(f"cannot {action} {resource} now: {error}") from error
    except api_errors.GoogleAPICallError as error:
        raise ComputeConfigError(f"Compute Engine refused to {action} {resource}: {error}") from error


def instance_name(url: str) -> str:
    """The instance name at the end of an instance URL (`.../zones/Z/instances/NAME`)."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def instance_path(url: str) -> str:
    """`projects/P/zones/Z/instances/NAME` of an instance URL, whatever host and API version it has."""
    path = url.rstrip("/")
    start = path.find("/projects/")
    return path[start + 1 :] if start >= 0 else path


def the_instance_named(directory: InstanceDirectory, vm: str, action: str) -> GceInstance | None:
    """The one instance of the scope named `vm`, None when there is none; several are refused."""
    named = directory.instances_named(vm)
    if len(named) > 1:
        raise ComputeConfigError(
            f"cannot {action} {vm}: {len(named)} instances of the trusted projects and zones are named so "
            f"({'; '.join(map(str, named))}); rename all but one, or narrow {ENV_TRUST_PROJECTS} and {ENV_TRUST_ZONES}"
        )
    return named[0] if named else None


@dataclass(frozen=True)
class _Operations:
    """Waits for zonal operations to finish and raises their errors."""

    client: compute_v1.ZoneOperationsClient
    project: str
    timeout: float
    clock: Callable[[], float] = time.monotonic

    def wait(self, operation: compute_v1.Operation, zone: str, action: str, resource: str, permission: str) -> None:
        deadline = self.clock() + self.timeout
        while not operation.done:
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise ComputeUnavailableError(
                    f"{action} {resource}: operation {operation.name} still not done after {self.timeout:.0f} s "
                    "(raise MBRIDGE_COMPUTE_TIMEOUT_SECONDS if the backend service drains connections for longer)"
                )
            # zoneOperations.wait answers when the operation is DONE or after at most 2 minutes; the
            # floor keeps the last call from timing out on the wire just before the server answers.
            with compute_errors("wait for an operation on", resource, OPERATIONS_PERMISSION):
                operation = self.client.wait(
                    project=self.project, zone=zone, operation=operation.name, timeout=max(min(remaining, 120.0), 5.0)
                )
        _raise_operation_error(operation, action, resource, permission)


def _raise_operation_error(operation: compute_v1.Operation, action: str, resource: str, permission: str) -> None:
    """A finished operation may still have failed: its error is part of the Operation."""
    details = "; ".join(f"{entry.code}: {entry.message}" for entry in operation.error.errors)
    code = operation.http_error_status_code
    if not details and not code:
        return
    # from_http_status picks the same exception class a failed call would raise, so one mapping serves both.
    error = api_errors.from_http_status(  # type: ignore[no-untyped-call]  # api_core leaves it unannotated
        code or 500, f"operation {operation.name}: {details or operation.http_error_message}"
    )
    with compute_errors(action, resource, permission):
        raise error


class InstanceGroupBalancer:
    """The LoadBalancer port over unmanaged (zonal) instance groups.

    Memento: `{"instance_groups": [{"zone", "name", "instance"}]}` — each group that listed the VM
    when it was located, and the instance URL it was listed under. `remove` and `restore` act on
    exactly that instance (its URL's project, zone and name), not on whatever has its name later.
    """

    def __init__(
        self,
        instance_groups: compute_v1.InstanceGroupsClient,
        zone_operations: compute_v1.ZoneOperationsClient,
        project: str,
        groups: Sequence[GroupRef],
        directory: InstanceDirectory,
        *,
        timeout: float = 120.0,
    ) -> None:
        self._groups_client = instance_groups
        self._operations = _Operations(zone_operations, project, timeout)
        self._project = project
        self._groups = tuple(groups)
        self._directory = directory
        self._timeout = timeout

    def locate(self, vm: str) -> JsonObject | None:
        """Read only: the memento of the configured groups that list the instance `vm` stands for,
        or None when none does (or no instance of the scope has the name)."""
        instance = the_instance_named(self._directory, vm, "locate")
        if instance is None:
            LOG.warning("no instance of the trusted projects is named %s: it is in no group to drain", vm)
            return None
        members = [
            (group, url) for group in self._groups if (url := self._member_url(group, instance.resource)) is not None
        ]
        if not members:
            return None
        return {MEMENTO_KEY: [{"zone": group.zone, "name": group.name, "instance": url} for group, url in members]}

    def remove(self, vm: str, memento: JsonObject) -> None:
        """Take the memento's instance out of each group of the memento that still lists it.

        A failure part way just raises: the memento is already recorded, so the retry calls this
        again and skips the groups done before, and `restore` puts back everything the memento names.
        """
        for group, recorded in _memento_groups(memento, vm):
            # Removed by the URL the group lists now, which is what removeInstances matches against.
            if (url := self._member_url(group, instance_path(recorded))) is not None:
                self._change(group, url, remove=True)

    def restore(self, vm: str, memento: JsonObject) -> None:
        for group, url in _memento_groups(memento, vm):
            if self._member_url(group, instance_path(url)) is None:
                self._change(group, url, remove=False)

    def _member_url(self, group: GroupRef, resource: str) -> str | None:
        """The URL under which `group` lists the instance `resource` (projects/P/zones/Z/instances/NAME)."""
        described = self._describe(group)
        with compute_errors("list the instances of", described, LIST_PERMISSION):
            pager = self._groups_client.list_instances(
                project=self._project,
                zone=group.zone,
                instance_group=group.name,
                instance_groups_list_instances_request_resource=compute_v1.InstanceGroupsListInstancesRequest(
                    instance_state="ALL"  # a stopped VM is still a member to restore later
                ),
                timeout=self._timeout,
            )
            for member in pager:
                if instance_path(member.instance) == resource:
                    return str(member.instance)
        return None

    def _change(self, group: GroupRef, url: str, *, remove: bool) -> None:
        resource = self._describe(group)
        action = f"{'remove' if remove else 'add'} {instance_name(url)} {'from' if remove else 'to'}"
        references = [compute_v1.InstanceReference(instance=url)]
        with compute_errors(action, resource, UPDATE_PERMISSION):
            if remove:
                operation = self._groups_client.remove_instances_unary(
                    project=self._project,
                    zone=group.zone,
                    instance_group=group.name,
                    instance_groups_remove_instances_request_resource=compute_v1.InstanceGroupsRemoveInstancesRequest(
                        instances=references
                    ),
                    timeout=self._timeout,
                )
            else:
                operation = self._groups_client.add_instances_unary(
                    project=self._project,
                    zone=group.zone,
                    instance_group=group.name,
                    instance_groups_add_instances_request_resource=compute_v1.InstanceGroupsAddInstancesRequest(
                        instances=references
                    ),
                    timeout=self._timeout,
                )
        self._operations.wait(operation, group.zone, action, resource, UPDATE_PERMISSION)
        LOG.info("%s %s: done", action, resource, extra={"labels": {"vm": instance_name(url), "group": str(group)}})

    def _describe(self, group: GroupRef) -> str:
        return f"instance group projects/{self._project}/zones/{group.zone}/instanceGroups/{group.name}"


def _memento_groups(memento: JsonObject, vm: str) -> list[tuple[GroupRef, str]]:
    entries = memento.get(MEMENTO_KEY)
    if not isinstance(entries, list) or not all(
        isinstance(entry, dict) and all(isinstance(entry.get(key), str) for key in ("zone", "name", "instance"))
        for entry in entries
    ):
        raise ComputeConfigError(
            f"the stored drain of {vm} is not an instance-group memento ({memento!r}); "
            "restore it by hand from the audit log"
        )
    return [(GroupRef(entry["zone"], entry["name"]), entry["instance"]) for entry in entries]


class ComputeMaintenance:
    """The Maintenance port: instances.performMaintenance ("start the announced maintenance now").

    The event names the VM; the directory says which instance of the scope that is, so the call
    goes to its project and zone, which must be one of `zones` (MBRIDGE_MAINTENANCE_ZONES: where
    the function may start maintenance). The call returns once Compute Engine accepted the
    request; the maintenance itself can run for minutes and is not awaited (the agent reports its
    progress as events).
    """

    def __init__(
        self,
        instances: compute_v1.InstancesClient,
        directory: InstanceDirectory,
        zones: Sequence[str],
        *,
        timeout: float = 120.0,
    ) -> None:
        if not zones:
            raise ComputeConfigError(f"performMaintenance needs the VMs' zones: set {ENV_MAINTENANCE_ZONES}")
        self._instances = instances
        self._directory = directory
        self._zones = tuple(zones)
        self._timeout = timeout

    def perform(self, vm: str) -> None:
        instance = the_instance_named(self._directory, vm, "start maintenance of")
        if instance is None:
            raise ComputeConfigError(
                f"no instance of the trusted projects and zones is named {vm}: it was deleted, or its project is "
                f"not in {ENV_TRUST_PROJECTS}"
            )
        resource = f"instance {instance}"
        if instance.zone not in self._zones:
            raise ComputeConfigError(
                f"{resource} is in zone {instance.zone}, where this function does not start maintenance: add the "
                f"zone to {ENV_MAINTENANCE_ZONES} ({', '.join(self._zones)})"
            )
        with compute_errors("start maintenance of", resource, MAINTENANCE_PERMISSION):
            operation = self._instances.perform_maintenance_unary(
                project=instance.project, zone=instance.zone, instance=instance.name, timeout=self._timeout
            )
        _raise_operation_error(operation, "start maintenance of", resource, MAINTENANCE_PERMISSION)
        LOG.info("performMaintenance accepted for %s (operation %s)", resource, operation.name)
