"""GCE instances as the deployment knows them: the scope (trusted projects and zones) and the
directory that says which instances of that scope carry a name.

An identity token names its VM by project, zone, instance id and name; maintenance events, drains
and commands name VMs by name only. A name is unique within one project and zone, not across
zones or projects, and anyone can make a project with a VM of any name. So a name stands for a VM
only when exactly one instance of the deployment's scope carries it, and a token speaks for that
name only when it is that instance's own (`GceTokenVerifier`). The Compute adapters resolve a
name through the same directory, so they act on that instance, wherever in the scope it is.

`InstanceDirectory` is the port: the Compute API behind it in the Cloud Function
(functions/gcp_app/instance_directory.py), a fixed set here for the trust file and the simulator.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

# projects/P/zones/Z/instances/NAME, as Compute Engine names an instance (and IAM conditions do).
_RESOURCE = re.compile(r"^projects/(?P<project>[^/\s]+)/zones/(?P<zone>[^/\s]+)/instances/(?P<name>[^/\s]+)$")
_INSTANCE_ID = re.compile(r"^[0-9]{1,20}$")


@dataclass(frozen=True)
class GceInstance:
    """One instance: where it is, its name, and the id Compute Engine gave it when it was made."""

    project: str
    zone: str
    name: str
    instance_id: str

    @property
    def resource(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/instances/{self.name}"

    def __str__(self) -> str:
        return f"{self.resource} (id {self.instance_id})"


@dataclass(frozen=True)
class InstanceScope:
    """The projects whose instances may report, and optionally the zones; never 'any project'."""

    projects: frozenset[str]
    zones: frozenset[str] | None = None  # None: every zone of the projects

    @classmethod
    def of(cls, projects: Collection[str], zones: Collection[str] | None = None) -> InstanceScope:
        if isinstance(projects, str) or (zones is not None and isinstance(zones, str)):
            raise ValueError("give projects and zones as collections of ids, not one string")
        if not projects or not all(projects):
            raise ValueError(
                "a GCE verifier needs the project ids whose VMs may report (a token of any project would be "
                "accepted otherwise, and anyone can create a project with a VM of any name)"
            )
        if zones is not None and (not zones or not all(zones)):
            raise ValueError("give the zones whose VMs may report, or None for every zone of the projects")
        return cls(frozenset(projects), None if zones is None else frozenset(zones))

    def admits(self, project: str, zone: str) -> bool:
        return project in self.projects and (self.zones is None or zone in self.zones)

    def __str__(self) -> str:
        projects = ", ".join(sorted(self.projects))
        zones = "every zone" if self.zones is None else "zones " + ", ".join(sorted(self.zones))
        return f"projects {projects} ({zones})"


class InstanceDirectory(Protocol):
    """The instances of the deployment's scope that carry a name."""

    def instances_named(self, name: str, *, expecting: str | None = None) -> Sequence[GceInstance]:
        """Every instance of the scope named `name` (none, one, or several in different zones or projects).

        `expecting` is an instance id the caller holds proof of: a directory that caches reads the
        instances again when none it knows has that id (an instance made since), as often as it allows.

        Raises:
            RetryableError: the instances cannot be listed now.
            PermanentError: the listing is refused (a missing role: the message names it).
        """
        ...


class StaticInstanceDirectory:
    """A fixed set of instances: the trust file's, which the simulator writes for its VMs."""

    def __init__(self, instances: Iterable[GceInstance]) -> None:
        self._by_name: dict[str, list[GceInstance]] = {}
        for instance in instances:
            self._by_name.setdefault(instance.name, []).append(instance)

    @classmethod
    def from_resources(cls, resources: Mapping[str, str]) -> StaticInstanceDirectory:
        """From `{"projects/P/zones/Z/instances/NAME": "instance id"}`.

        Raises:
            ValueError: a key is not an instance's resource name, or a value not an instance id.
        """
        return cls(parse_instance(resource, instance_id) for resource, instance_id in resources.items())

    def instances_named(self, name: str, *, expecting: str | None = None) -> Sequence[GceInstance]:
        return tuple(self._by_name.get(name, ()))


def parse_instance(resource: str, instance_id: str) -> GceInstance:
    match = _RESOURCE.match(resource)
    if match is None:
        raise ValueError(f"{resource[:200]!r} is not an instance's resource name (projects/P/zones/Z/instances/NAME)")
    if not isinstance(instance_id, str) or not _INSTANCE_ID.match(instance_id):
        raise ValueError(f"the id of {resource} must be the instance's numeric id as text, got {instance_id!r}")
    return GceInstance(match["project"], match["zone"], match["name"], instance_id)
