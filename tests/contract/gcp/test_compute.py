"""The Compute Engine adapters with the real google-cloud-compute clients (REST transport) against a
local stand-in for compute.googleapis.com.

The stand-in answers the paths and JSON shapes of the Compute Engine v1 API (instanceGroups
listInstances / removeInstances / addInstances, zoneOperations wait, instances
performMaintenance and aggregatedList, the reads of autohealing and of the backend services'
health checks, and the API's error bodies), keeps group membership and
the instances of several projects, and records every request, so each test asserts on what went
over the wire.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

import pytest
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import compute_v1

from functions.core.ports import JsonObject
from functions.gcp_app.compute import ComputeConfigError, ComputeMaintenance, InstanceGroupBalancer
from functions.gcp_app.instance_directory import ComputeInstanceDirectory
from functions.gcp_app.settings import GroupRef
from functions.trust.gce_instances import GceInstance, InstanceDirectory, StaticInstanceDirectory
from wire.errors import PermanentError, RetryableError

PROJECT = "shop-prod"
ZONE_B, ZONE_C = "europe-west1-b", "europe-west1-c"
BASE = "https://www.googleapis.com/compute/v1"
API_PREFIX = f"/compute/v1/projects/{PROJECT}/zones"
_ROUTE = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/"
    r"(?P<collection>instanceGroups|instances|operations)/(?P<name>[^/]+)(?:/(?P<verb>[A-Za-z]+))?$"
)
_AGGREGATED = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/aggregated/instances$")
# The reads of autohealing (functions/gcp_app/autohealer.py): an instance, a group manager, a health check.
_READS = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/"
    r"(?P<where>zones/[^/]+/instances|zones/[^/]+/instanceGroupManagers|regions/[^/]+/instanceGroupManagers"
    r"|global/healthChecks|regions/[^/]+/healthChecks)/(?P<name>[^/]+)$"
)
# The reads of the probes' times (functions/gcp_app/probe_times.py): the backend services, global or of a region.
_SERVICES = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/(?P<where>global|regions/[^/]+)/backendServices$")
_NAME_FILTER = re.compile(r'^name = "(?P<name>[^"]+)"$')


def anonymous() -> Credentials:
    return AnonymousCredentials()  # type: ignore[no-untyped-call]  # google-auth leaves it unannotated


def instance_url(zone: str, vm: str, project: str = PROJECT) -> str:
    return f"{BASE}/projects/{project}/zones/{zone}/instances/{vm}"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: Any


@dataclass
class ComputeApi:
    """State and scripted answers of the stand-in. `fail[suffix]` answers the next calls whose path
    ends with `suffix` (a verb, or "group/verb") with (status, reason) errors; `fail_operation[suffix]`
    lets the next such calls return an operation that finishes with an (http status, code, message)
    error and changes nothing; `running` makes operations start RUNNING and finish on `wait`."""

    members: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    instances: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (project, zone, name) -> id
    # What autohealing reads: an instance's created-by metadata, (project, zone, name) -> group path;
    # a group manager's autohealing health checks, "projects/P/zones|regions/L/instanceGroupManagers/N" ->
    # health check URLs; a health check, "projects/P/global|regions/R/healthChecks/N" -> its resource.
    created_by: dict[tuple[str, str, str], str] = field(default_factory=dict)
    managers: dict[str, list[str]] = field(default_factory=dict)
    health_checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The backend services, "projects/P/global" or "projects/P/regions/R" -> their resources.
    backend_services: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # (project, zone, name) -> its resourceStatus.upcomingMaintenance, for the instances that have one
    upcoming: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    fail: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    fail_operation: dict[str, list[tuple[int, str, str]]] = field(default_factory=dict)
    running: bool = False
    never_done: bool = False
    operation_error: tuple[int, str, str] | None = None  # (http status, code, message) of a finished operation
    requests: list[Request] = field(default_factory=list)
    _operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    _operation_errors: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def verbs(self) -> list[str]:
        return [request.path.rsplit("/", 1)[-1] for request in self.requests]

    def given(self, zone: str, name: str, instance_id: str, project: str = PROJECT) -> GceInstance:
        self.instances[(project, zone, name)] = instance_id
        return GceInstance(project, zone, name, instance_id)

    def answer(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(Request(method, path, body))
            aggregated = _AGGREGATED.match(path)
            if aggregated is not None:
                return self._aggregated(path, str(aggregated["project"]), body or {})
            services = _SERVICES.match(path) if method == "GET" else None
            if services is not None:
                return self._services(path, f"projects/{services['project']}/{services['where']}")
            read = _READS.match(path) if method == "GET" else None
            if read is not None:
                failures = _scripted(self.fail, path)
                if failures:
                    status, reason = failures.pop(0)
                    return _error(status, reason, f"scripted {reason} for {path}")
                return self._read(str(read["project"]), str(read["where"]), str(read["name"]))
            match = _ROUTE.match(path)
            if match is None or (match["project"] != PROJECT and match["collection"] != "instances"):
                return _error(404, "notFound", f"The resource '{path}' was not found")
            project = str(match["project"])
            zone, name, verb = str(match["zone"]), str(match["name"]), str(match["verb"] or "get")
            failures = _scripted(self.fail, path)
            if failures:
                status, reason = failures.pop(0)
                return _error(status, reason, f"scripted {reason} for {verb}")
            if match["collection"] == "instanceGroups":
                doomed = _scripted(self.fail_operation, path)
                return self._group(zone, name, verb, body, doomed.pop(0) if doomed else None)
            if match["collection"] == "operations":
                return self._wait(name)
            if (project, zone, name) not in self.instances:
                return _error(
                    404, "notFound", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
                )
            return 200, self._operation(zone, "compute.instances.performMaintenance", f"instances/{name}")

    def _read(self, project: str, where: str, name: str) -> tuple[int, dict[str, Any]]:
        key = f"projects/{project}/{where}/{name}"
        if where.endswith("/instances"):
            zone = where.split("/")[1]
            if (project, zone, name) not in self.instances:
                return _error(404, "notFound", f"The resource '{key}' was not found")
            group = self.created_by.get((project, zone, name))
            items = [{"key": "created-by", "value": group}] if group else []
            return 200, {"kind": "compute#instance", "name": name, "id": self.instances[(project, zone, name)],
                         "metadata": {"items": [*items, {"key": "startup-script", "value": "#!/bin/sh"}]}}  # fmt: skip
        if where.endswith("/instanceGroupManagers"):
            if key not in self.managers:
                return _error(404, "notFound", f"The resource '{key}' was not found")
            policies = [{"healthCheck": check, "initialDelaySec": 300} for check in self.managers[key]]
            return 200, {"kind": "compute#instanceGroupManager", "name": name, "autoHealingPolicies": policies}
        if key not in self.health_checks:
            return _error(404, "notFound", f"The resource '{key}' was not found")
        return 200, {"kind": "compute#healthCheck", "name": name, **self.health_checks[key]}

    def _services(self, path: str, where: str) -> tuple[int, dict[str, Any]]:
        """backendServices.list and regionBackendServices.list: every service of the place, one page."""
        failures = _scripted(self.fail, path)
        if failures:
            status, reason = failures.pop(0)
            return _error(status, reason, f"scripted {reason} for {path}")
        items = [{"kind": "compute#backendService", **service} for service in self.backend_services.get(where, [])]
        listing = {"kind": "compute#backendServiceList", "id": f"{where}/backendServices"}
        return 200, {**listing, "items": items} if items else listing

    def _aggregated(self, path: str, project: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """instances.aggregatedList: {"zones/Z": {"instances": [...]}}, with AIP-160 `name = "X"` filters."""
        failures = _scripted(self.fail, path)
        if failures:
            status, reason = failures.pop(0)
            return _error(status, reason, f"scripted {reason} for aggregatedList")
        wanted = _NAME_FILTER.match(query.get("filter", ""))
        items: dict[str, Any] = {}
        for (owner, zone, name), instance_id in sorted(self.instances.items()):
            if owner == project and (wanted is None or wanted["name"] == name):
                link = f"{BASE}/projects/{owner}/zones/{zone}"
                entry: dict[str, Any] = {
                    "kind": "compute#instance",
                    "id": instance_id,
                    "name": name,
                    "zone": link,
                    "status": "RUNNING",
                }
                window = self.upcoming.get((owner, zone, name))
                if window is not None:
                    entry["resourceStatus"] = {"upcomingMaintenance": window}
                items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(
                    {**entry, "selfLink": f"{link}/instances/{name}"}
                )
        return 200, {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{project}/aggregated/instances",
            "items": items,
        }

    def _group(
        self, zone: str, name: str, verb: str, body: Any, error: tuple[int, str, str] | None
    ) -> tuple[int, dict[str, Any]]:
        if (zone, name) not in self.members:
            return _error(
                404, "notFound", f"The resource 'projects/{PROJECT}/zones/{zone}/instanceGroups/{name}' was not found"
            )
        members = self.members[(zone, name)]
        link = f"{BASE}/projects/{PROJECT}/zones/{zone}/instanceGroups/{name}"
        if verb == "listInstances":
            items = [{"instance": url, "status": "RUNNING"} for url in members]
            listing = {
                "kind": "compute#instanceGroupsListInstances",
                "id": f"{link}/listInstances",
                "selfLink": f"{link}/listInstances",
            }
            return 200, {**listing, "items": items} if items else listing
        urls = [entry["instance"] for entry in body.get("instances", [])]
        if error is not None:
            pass  # the operation fails, so the membership stays as it was
        elif verb == "removeInstances":
            members[:] = [url for url in members if url not in urls]
        elif verb == "addInstances":
            members.extend(url for url in urls if url not in members)
        return 200, self._operation(zone, f"compute.instanceGroups.{verb}", f"instanceGroups/{name}", error)

    def _operation(
        self, zone: str, kind: str, target: str, error: tuple[int, str, str] | None = None
    ) -> dict[str, Any]:
        name = f"operation-{int(time.time() * 1000)}-{len(self._operations):04d}-abcdef"
        zone_link = f"{BASE}/projects/{PROJECT}/zones/{zone}"
        operation: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(4_000_000_000_000_000_000 + len(self._operations)),
            "name": name,
            "zone": zone_link,
            "operationType": kind.rsplit(".", 1)[-1],
            "targetLink": f"{zone_link}/{target}",
            "targetId": "8034920389429348923",
            "status": "RUNNING" if self.running else "DONE",
            "user": "mbridge-functions@shop-prod.iam.gserviceaccount.com",
            "progress": 0 if self.running else 100,
            "insertTime": "2026-03-01T04:00:00.000-08:00",
            "startTime": "2026-03-01T04:00:00.100-08:00",
            "selfLink": f"{zone_link}/operations/{name}",
        }
        self._operations[name] = operation
        if error is not None:
            self._operation_errors[name] = error
        return self._finished(name) if not self.running else operation

    def _wait(self, name: str) -> tuple[int, dict[str, Any]]:
        if name not in self._operations:
            return _error(404, "notFound", f"The resource 'operations/{name}' was not found")
        if self.never_done:
            time.sleep(0.05)  # the real wait holds the request up to 2 minutes
            return 200, self._operations[name]
        return 200, self._finished(name)

    def _finished(self, name: str) -> dict[str, Any]:
        operation = {
            **self._operations[name],
            "status": "DONE",
            "progress": 100,
            "endTime": "2026-03-01T04:00:01.000-08:00",
        }
        error = self._operation_errors.get(name, self.operation_error)
        if error is not None:
            status, code, message = error
            operation["error"] = {"errors": [{"code": code, "message": message}]}
            operation["httpErrorStatusCode"] = status
            operation["httpErrorMessage"] = {403: "FORBIDDEN", 400: "BAD REQUEST", 503: "SERVICE UNAVAILABLE"}.get(
                status, "ERROR"
            )
        return operation


def _scripted(script: dict[str, list[Any]], path: str) -> list[Any] | None:
    """The queue of scripted answers for the first suffix of `path` that has one left."""
    return next((queue for suffix, queue in script.items() if path.endswith(suffix) and queue), None)


def _error(status: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    return status, {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


class _Handler(BaseHTTPRequestHandler):
    api: ComputeApi

    def do_GET(self) -> None:  # instances.aggregatedList: the query is recorded as the body
        path, _, query = self.path.partition("?")
        self._send(*self.api.answer("GET", path, dict(parse_qsl(query))))

    def do_POST(self) -> None:  # every call these adapters make is a POST
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        self._send(*self.api.answer("POST", path, json.loads(raw) if raw else None))

    def _send(self, status: int, document: dict[str, Any]) -> None:
        payload = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test asserts on the recorded requests instead."""


@dataclass
class Fixture:
    api: ComputeApi
    url: str

    def options(self) -> dict[str, Any]:
        return {
            "credentials": anonymous(),
            "client_options": {"api_endpoint": self.url},
            "transport": "rest",
        }

    def directory(
        self, projects: tuple[str, ...] = (PROJECT,), zones: tuple[str, ...] | None = None
    ) -> ComputeInstanceDirectory:
        """The instances of `projects` (and `zones`) as the Compute API lists them."""
        return ComputeInstanceDirectory(compute_v1.InstancesClient(**self.options()), projects, zones, timeout=10.0)

    def balancer(
        self, groups: list[GroupRef], timeout: float = 10.0, directory: InstanceDirectory | None = None
    ) -> InstanceGroupBalancer:
        """Default directory: the instances the test gave the stand-in, known without asking it, so
        that the requests recorded are the instance groups' only."""
        return InstanceGroupBalancer(
            compute_v1.InstanceGroupsClient(**self.options()),
            compute_v1.ZoneOperationsClient(**self.options()),
            PROJECT,
            groups,
            directory or self.known_instances(),
            timeout=timeout,
        )

    def maintenance(self, zones: list[str], directory: InstanceDirectory | None = None) -> ComputeMaintenance:
        return ComputeMaintenance(
            compute_v1.InstancesClient(**self.options()), directory or self.known_instances(), zones, timeout=10.0
        )

    def known_instances(self) -> StaticInstanceDirectory:
        return StaticInstanceDirectory(
            GceInstance(project, zone, name, instance_id)
            for (project, zone, name), instance_id in self.api.instances.items()
        )


@pytest.fixture
def compute() -> Iterator[Fixture]:
    api = ComputeApi()
    handler = type("Handler", (_Handler,), {"api": api})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield Fixture(api, f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()
    server.server_close()


WEB_B, WEB_C, API_B = GroupRef(ZONE_B, "web-b"), GroupRef(ZONE_C, "web-c"), GroupRef(ZONE_B, "api-b")


def given_groups(compute: Fixture) -> None:
    """web-0 is in web-b and api-b (zone b); web-1 in web-b; web-2 in web-c (zone c); db-0 (zone b) in none."""
    for zone, vm, instance_id in ((ZONE_B, "web-0", "100"), (ZONE_B, "web-1", "101"), (ZONE_C, "web-2", "102")):
        compute.api.given(zone, vm, instance_id)
    compute.api.given(ZONE_B, "db-0", "103")
    compute.api.members.update(
        {
            (ZONE_B, "web-b"): [instance_url(ZONE_B, "web-0"), instance_url(ZONE_B, "web-1")],
            (ZONE_B, "api-b"): [instance_url(ZONE_B, "web-0")],
            (ZONE_C, "web-c"): [instance_url(ZONE_C, "web-2")],
        }
    )


def drained(balancer: InstanceGroupBalancer, vm: str) -> JsonObject:
    """What the core does to drain: locate, record the memento, then remove."""
    memento = balancer.locate(vm)
    assert memento is not None
    balancer.remove(vm, memento)
    return memento


def memento_of(*groups: tuple[GroupRef, str]) -> JsonObject:
    return {
        "instance_groups": [
            {"zone": group.zone, "name": group.name, "instance": instance_url(group.zone, vm)} for group, vm in groups
        ]
    }


def removal(zone: str, vm: str) -> dict[str, Any]:
    return {"instances": [{"instance": instance_url(zone, vm)}]}


# ---------------------------------------------------------------- locate


def test_locate_lists_every_configured_group_and_changes_nothing(compute: Fixture) -> None:
    # GIVEN web-0 in two of the three configured groups
    given_groups(compute)
    # WHEN it is located
    memento = compute.balancer([WEB_B, WEB_C, API_B]).locate("web-0")
    # THEN each group was listed (all instance states), only listed, and the memento names its two
    assert memento == memento_of((WEB_B, "web-0"), (API_B, "web-0"))
    assert compute.api.requests == [
        Request("POST", f"{API_PREFIX}/{ZONE_B}/instanceGroups/web-b/listInstances", {"instanceState": "ALL"}),
        Request("POST", f"{API_PREFIX}/{ZONE_C}/instanceGroups/web-c/listInstances", {"instanceState": "ALL"}),
        Request("POST", f"{API_PREFIX}/{ZONE_B}/instanceGroups/api-b/listInstances", {"instanceState": "ALL"}),
    ]
    assert instance_url(ZONE_B, "web-0") in compute.api.members[(ZONE_B, "web-b")]
    assert compute.api.members[(ZONE_B, "api-b")] == [instance_url(ZONE_B, "web-0")]


def test_a_vm_in_no_configured_group_is_located_nowhere(compute: Fixture) -> None:
    given_groups(compute)
    assert compute.balancer([WEB_B, WEB_C]).locate("db-0") is None
    assert compute.api.verbs() == ["listInstances", "listInstances"]


@pytest.mark.parametrize(
    ("status", "reason"),
    [(503, "backendError"), (500, "internalError"), (429, "rateLimitExceeded"), (504, "deadlineExceeded")],
)
def test_transient_api_errors_are_retryable(compute: Fixture, status: int, reason: str) -> None:
    given_groups(compute)
    compute.api.fail["listInstances"] = [(status, reason)]
    with pytest.raises(RetryableError, match="instanceGroups/web-b"):
        compute.balancer([WEB_B]).locate("web-0")


def test_a_missing_permission_is_permanent_and_names_resource_and_permission(compute: Fixture) -> None:
    given_groups(compute)
    compute.api.fail["listInstances"] = [(403, "forbidden")]
    with pytest.raises(PermanentError) as raised:
        compute.balancer([WEB_B]).locate("web-0")
    message = str(raised.value)
    assert f"projects/{PROJECT}/zones/{ZONE_B}/instanceGroups/web-b" in message
    assert "compute.instanceGroups.list" in message


def test_a_missing_group_is_permanent_and_names_the_setting(compute: Fixture) -> None:
    given_groups(compute)
    with pytest.raises(PermanentError, match="MBRIDGE_INSTANCE_GROUPS") as raised:
        compute.balancer([GroupRef(ZONE_B, "gone")]).locate("web-0")
    assert "instanceGroups/gone" in str(raised.value)


# ---------------------------------------------------------------- remove


def test_remove_takes_the_vm_out_of_exactly_the_groups_of_its_memento(compute: Fixture) -> None:
    # GIVEN web-0 located in web-b and api-b
    given_groups(compute)
    balancer = compute.balancer([WEB_B, WEB_C, API_B])
    memento = balancer.locate("web-0")
    assert memento is not None
    compute.api.requests.clear()
    # WHEN it is removed
    balancer.remove("web-0", memento)
    # THEN each group of the memento was listed, then the VM removed from it by its instance URL
    assert compute.api.requests == [
        Request("POST", f"{API_PREFIX}/{ZONE_B}/instanceGroups/web-b/listInstances", {"instanceState": "ALL"}),
        Request("POST", f"{API_PREFIX}/{ZONE_B}/instanceGroups/web-b/removeInstances", removal(ZONE_B, "web-0")),
        Request("POST", f"{API_PREFIX}/{ZONE_B}/instanceGroups/api-b/listInstances", {"instanceState": "ALL"}),
        Request("POST", f"{API_PREFIX}/{ZONE_B}/instanceGroups/api-b/removeInstances", removal(ZONE_B, "web-0")),
    ]
    assert compute.api.members[(ZONE_B, "web-b")] == [instance_url(ZONE_B, "web-1")]
    assert compute.api.members[(ZONE_B, "api-b")] == []
    assert compute.api.members[(ZONE_C, "web-c")] == [instance_url(ZONE_C, "web-2")]


def test_a_repeated_remove_removes_nothing_twice(compute: Fixture) -> None:
    # GIVEN web-0 removed from its two groups
    given_groups(compute)
    balancer = compute.balancer([WEB_B, API_B])
    memento = drained(balancer, "web-0")
    compute.api.requests.clear()
    # WHEN the same memento is removed again (the redelivery after a crash)
    balancer.remove("web-0", memento)
    # THEN the groups were only listed
    assert compute.api.verbs() == ["listInstances", "listInstances"]
    assert compute.api.members[(ZONE_B, "web-b")] == [instance_url(ZONE_B, "web-1")]


@pytest.mark.parametrize("failure", ["call", "operation"])
def test_a_remove_that_fails_part_way_is_finished_by_the_retry_and_undone_by_restore(
    compute: Fixture, failure: str
) -> None:
    # GIVEN web-0 located in web-b and api-b, and its removal from api-b failing for now
    given_groups(compute)
    balancer = compute.balancer([WEB_B, API_B])
    memento = balancer.locate("web-0")
    assert memento is not None
    if failure == "call":
        compute.api.fail["api-b/removeInstances"] = [(503, "backendError")]
    else:
        compute.api.fail_operation["api-b/removeInstances"] = [(503, "SERVICE_UNAVAILABLE", "backend unavailable")]
    # WHEN it is removed THEN the failure asks for a retry, with the VM out of web-b only (not put back)
    with pytest.raises(RetryableError, match="instanceGroups/api-b"):
        balancer.remove("web-0", memento)
    assert compute.api.verbs().count("addInstances") == 0
    assert compute.api.members[(ZONE_B, "web-b")] == [instance_url(ZONE_B, "web-1")]
    assert compute.api.members[(ZONE_B, "api-b")] == [instance_url(ZONE_B, "web-0")]
    # WHEN the retry removes it with the same memento THEN only api-b is changed
    compute.api.requests.clear()
    balancer.remove("web-0", memento)
    assert [r for r in compute.api.requests if r.path.endswith(("removeInstances", "addInstances"))] == [
        Request("POST", f"{API_PREFIX}/{ZONE_B}/instanceGroups/api-b/removeInstances", removal(ZONE_B, "web-0")),
    ]
    assert compute.api.members[(ZONE_B, "api-b")] == []
    # WHEN it is restored THEN it is back in both groups of the memento
    compute.api.requests.clear()
    balancer.restore("web-0", memento)
    assert [r for r in compute.api.requests if r.path.endswith("addInstances")] == [
        Request("POST", f"{API_PREFIX}/{ZONE_B}/instanceGroups/web-b/addInstances", removal(ZONE_B, "web-0")),
        Request("POST", f"{API_PREFIX}/{ZONE_B}/instanceGroups/api-b/addInstances", removal(ZONE_B, "web-0")),
    ]
    assert instance_url(ZONE_B, "web-0") in compute.api.members[(ZONE_B, "web-b")]
    assert compute.api.members[(ZONE_B, "api-b")] == [instance_url(ZONE_B, "web-0")]


def test_a_running_operation_is_awaited_with_zone_operations_wait(compute: Fixture) -> None:
    # GIVEN an API whose operations start RUNNING
    given_groups(compute)
    compute.api.running = True
    balancer = compute.balancer([WEB_C])
    memento = memento_of((WEB_C, "web-2"))
    # WHEN web-2 is removed THEN the adapter waited on the operation before returning
    balancer.remove("web-2", memento)
    assert compute.api.verbs() == ["listInstances", "removeInstances", "wait"]
    assert re.fullmatch(rf"{API_PREFIX}/{ZONE_C}/operations/operation-[0-9a-z-]+/wait", compute.api.requests[2].path)


def test_an_operation_that_never_finishes_is_retried_later(compute: Fixture) -> None:
    given_groups(compute)
    compute.api.running = compute.api.never_done = True
    with pytest.raises(RetryableError, match="still not done"):
        compute.balancer([WEB_C], timeout=0.5).remove("web-2", memento_of((WEB_C, "web-2")))


def test_a_failed_operation_names_the_permission_to_grant(compute: Fixture) -> None:
    given_groups(compute)
    compute.api.operation_error = (403, "PERMISSION_DENIED", "Required 'compute.instanceGroups.update' permission")
    with pytest.raises(PermanentError, match=r"compute\.instanceGroups\.update") as raised:
        compute.balancer([WEB_C]).remove("web-2", memento_of((WEB_C, "web-2")))
    assert "instanceGroups/web-c" in str(raised.value)


# ---------------------------------------------------------------- restore


def test_restore_adds_the_vm_back_to_exactly_the_groups_of_its_memento(compute: Fixture) -> None:
    # GIVEN web-0 drained from its two groups
    given_groups(compute)
    balancer = compute.balancer([WEB_B, WEB_C, API_B])
    memento = drained(balancer, "web-0")
    compute.api.requests.clear()
    # WHEN it is restored
    balancer.restore("web-0", memento)
    # THEN it is back in web-b and api-b only, added by its instance URL
    addition = {"instances": [{"instance": instance_url(ZONE_B, "web-0")}]}
    assert [r for r in compute.api.requests if r.path.endswith("addInstances")] == [
        Request("POST", f"{API_PREFIX}/{ZONE_B}/instanceGroups/web-b/addInstances", addition),
        Request("POST", f"{API_PREFIX}/{ZONE_B}/instanceGroups/api-b/addInstances", addition),
    ]
    assert compute.api.members[(ZONE_C, "web-c")] == [instance_url(ZONE_C, "web-2")]
    assert instance_url(ZONE_B, "web-0") in compute.api.members[(ZONE_B, "api-b")]


def test_a_repeated_restore_adds_nothing_twice(compute: Fixture) -> None:
    given_groups(compute)
    balancer = compute.balancer([WEB_B])
    memento = drained(balancer, "web-1")
    balancer.restore("web-1", memento)
    balancer.restore("web-1", memento)  # the redelivery of a completion
    assert compute.api.verbs().count("addInstances") == 1
    assert compute.api.members[(ZONE_B, "web-b")].count(instance_url(ZONE_B, "web-1")) == 1


def test_restore_uses_the_memento_even_for_a_group_no_longer_configured(compute: Fixture) -> None:
    given_groups(compute)
    memento = drained(compute.balancer([WEB_B, API_B]), "web-0")
    compute.balancer([WEB_B]).restore("web-0", memento)
    assert instance_url(ZONE_B, "web-0") in compute.api.members[(ZONE_B, "api-b")]


@pytest.mark.parametrize("step", ["remove", "restore"])
@pytest.mark.parametrize(
    "memento",
    [
        {"instance_groups": "web-b"},
        {"groups": []},
        {"instance_groups": [{"zone": ZONE_B, "name": "web-b"}]},
        {"instance_groups": [{"zone": ZONE_B, "name": "web-b", "instance": 7}]},
    ],
)
def test_a_memento_of_another_shape_is_refused_with_what_to_do(
    compute: Fixture, step: str, memento: JsonObject
) -> None:
    given_groups(compute)
    balancer = compute.balancer([WEB_B])
    with pytest.raises(ComputeConfigError, match=r"web-0 is not an instance-group memento.*restore it by hand"):
        getattr(balancer, step)("web-0", memento)
    assert compute.api.requests == []
    assert instance_url(ZONE_B, "web-0") in compute.api.members[(ZONE_B, "web-b")]


# ---------------------------------------------------------------- performMaintenance


def test_perform_maintenance_asks_the_instance_in_the_zone_the_directory_knows(compute: Fixture) -> None:
    # GIVEN web-2 in zone c, listed by the Compute API, and the adapter configured for zones b and c
    compute.api.given(ZONE_C, "web-2", "102")
    # WHEN maintenance is started THEN the instance was found by name in the project, and only it asked
    compute.maintenance([ZONE_B, ZONE_C], directory=compute.directory()).perform("web-2")
    assert compute.api.requests == [
        Request("GET", f"/compute/v1/projects/{PROJECT}/aggregated/instances", {"filter": 'name = "web-2"'}),
        Request("POST", f"{API_PREFIX}/{ZONE_C}/instances/web-2/performMaintenance", None),
    ]


def test_perform_maintenance_of_an_unknown_vm_names_the_settings(compute: Fixture) -> None:
    with pytest.raises(PermanentError, match=r"no instance .* named ghost.*MBRIDGE_TRUST_PROJECTS"):
        compute.maintenance([ZONE_B, ZONE_C]).perform("ghost")
    assert compute.api.requests == []


def test_perform_maintenance_outside_the_maintenance_zones_names_the_setting(compute: Fixture) -> None:
    compute.api.given(ZONE_C, "web-2", "102")
    with pytest.raises(PermanentError, match=rf"zone {ZONE_C}.*MBRIDGE_MAINTENANCE_ZONES"):
        compute.maintenance([ZONE_B]).perform("web-2")
    assert compute.api.requests == []


def test_perform_maintenance_of_a_name_two_instances_carry_is_refused(compute: Fixture) -> None:
    # GIVEN two instances named web-2 in the scope: one in zone c, one in zone b
    compute.api.given(ZONE_C, "web-2", "102")
    compute.api.given(ZONE_B, "web-2", "666")
    # THEN neither is picked: the name stands for no instance until one is renamed
    with pytest.raises(PermanentError, match=r"2 instances .* are named so.*rename"):
        compute.maintenance([ZONE_B, ZONE_C], directory=compute.directory()).perform("web-2")
    assert compute.api.verbs() == ["instances"]


def test_perform_maintenance_in_another_trusted_project_goes_to_that_project(compute: Fixture) -> None:
    compute.api.given(ZONE_C, "batch-0", "300", project="shop-batch")
    directory = compute.directory(projects=(PROJECT, "shop-batch"))
    compute.maintenance([ZONE_C], directory=directory).perform("batch-0")
    assert compute.api.requests[-1] == Request(
        "POST", f"/compute/v1/projects/shop-batch/zones/{ZONE_C}/instances/batch-0/performMaintenance", None
    )


def test_perform_maintenance_without_permission_names_it(compute: Fixture) -> None:
    compute.api.given(ZONE_C, "web-2", "102")
    compute.api.fail["performMaintenance"] = [(403, "forbidden")]
    with pytest.raises(PermanentError, match=r"compute\.instances\.performMaintenance") as raised:
        compute.maintenance([ZONE_C]).perform("web-2")
    assert f"zones/{ZONE_C}/instances/web-2" in str(raised.value)


def test_perform_maintenance_refused_by_the_operation_is_permanent(compute: Fixture) -> None:
    compute.api.given(ZONE_C, "web-2", "102")
    compute.api.operation_error = (400, "INVALID_OPERATION", "No pending maintenance for the instance")
    with pytest.raises(PermanentError, match="No pending maintenance"):
        compute.maintenance([ZONE_C]).perform("web-2")


def test_perform_maintenance_retries_when_the_api_is_unavailable(compute: Fixture) -> None:
    compute.api.given(ZONE_C, "web-2", "102")
    compute.api.fail["performMaintenance"] = [(503, "backendError")]
    with pytest.raises(RetryableError):
        compute.maintenance([ZONE_C]).perform("web-2")


def test_maintenance_without_zones_is_a_configuration_error() -> None:
    with pytest.raises(PermanentError, match="MBRIDGE_MAINTENANCE_ZONES"):
        ComputeMaintenance(compute_v1.InstancesClient(credentials=anonymous()), StaticInstanceDirectory([]), [])


# ---------------------------------------------------------------- the instance a name stands for


def test_locate_drains_the_instance_of_the_scope_not_a_namesake_in_another_zone(compute: Fixture) -> None:
    # GIVEN web-0 in zone b (in web-b and api-b), and another instance named web-0 in zone c, in
    # group web-c: the function trusts zone b only
    given_groups(compute)
    compute.api.given(ZONE_C, "web-0", "666")
    compute.api.members[(ZONE_C, "web-c")].append(instance_url(ZONE_C, "web-0"))
    balancer = compute.balancer([WEB_B, WEB_C, API_B], directory=compute.directory(zones=(ZONE_B,)))

    # WHEN web-0 is located THEN only the groups listing zone b's web-0 are in the memento
    assert balancer.locate("web-0") == memento_of((WEB_B, "web-0"), (API_B, "web-0"))


def test_locate_refuses_a_name_two_instances_of_the_scope_carry(compute: Fixture) -> None:
    given_groups(compute)
    compute.api.given(ZONE_C, "web-0", "666")
    with pytest.raises(PermanentError, match=r"2 instances .* are named so"):
        compute.balancer([WEB_B, WEB_C], directory=compute.directory()).locate("web-0")
    assert "listInstances" not in compute.api.verbs()


def test_a_member_is_matched_by_project_zone_and_name_not_by_the_name_at_the_end(compute: Fixture) -> None:
    # GIVEN group web-b lists an instance URL that merely ends in web-0 (another project's)
    compute.api.given(ZONE_B, "web-0", "100")
    compute.api.members[(ZONE_B, "web-b")] = [instance_url(ZONE_B, "web-0", project="someone-else")]
    # THEN it is not web-0's membership: nothing to drain
    assert compute.balancer([WEB_B]).locate("web-0") is None


def test_remove_and_restore_act_on_the_memento_instance_without_asking_the_directory(compute: Fixture) -> None:
    # GIVEN web-0 drained, then deleted: no instance carries its name any more
    given_groups(compute)
    memento = drained(compute.balancer([WEB_B]), "web-0")
    del compute.api.instances[(PROJECT, ZONE_B, "web-0")]
    # WHEN it is restored THEN the memento's instance goes back, with no directory lookup
    compute.balancer([WEB_B], directory=StaticInstanceDirectory([])).restore("web-0", memento)
    assert instance_url(ZONE_B, "web-0") in compute.api.members[(ZONE_B, "web-b")]


# ---------------------------------------------------------------- the instance directory


class Ticks:
    """A monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def directory_with(compute: Fixture, clock: Ticks, **scope: Any) -> ComputeInstanceDirectory:
    return ComputeInstanceDirectory(
        compute_v1.InstancesClient(**compute.options()),
        scope.get("projects", (PROJECT,)),
        scope.get("zones"),
        timeout=10.0,
        clock=clock,
    )


def listings(compute: Fixture) -> list[Request]:
    return [request for request in compute.api.requests if request.method == "GET"]


def test_the_directory_lists_each_trusted_project_by_name_and_keeps_the_trusted_zones(compute: Fixture) -> None:
    compute.api.given(ZONE_B, "web-0", "100")
    compute.api.given(ZONE_C, "web-0", "200")
    compute.api.given(ZONE_B, "web-0", "300", project="shop-batch")
    compute.api.given(ZONE_B, "web-0", "400", project="not-trusted")
    directory = directory_with(compute, Ticks(), projects=(PROJECT, "shop-batch"), zones=(ZONE_B,))

    assert directory.instances_named("web-0") == (
        GceInstance("shop-batch", ZONE_B, "web-0", "300"),
        GceInstance(PROJECT, ZONE_B, "web-0", "100"),
    )
    assert listings(compute) == [
        Request("GET", "/compute/v1/projects/shop-batch/aggregated/instances", {"filter": 'name = "web-0"'}),
        Request("GET", f"/compute/v1/projects/{PROJECT}/aggregated/instances", {"filter": 'name = "web-0"'}),
    ]


def test_a_name_that_is_no_instance_name_is_never_put_in_a_filter(compute: Fixture) -> None:
    directory = directory_with(compute, Ticks())
    assert directory.instances_named('web-0" OR name != "x') == ()
    assert compute.api.requests == []


def test_answers_are_cached_and_an_unknown_id_lists_again_at_most_once_a_minute(compute: Fixture) -> None:
    clock = Ticks()
    compute.api.given(ZONE_B, "web-0", "100")
    directory = directory_with(compute, clock)
    assert [i.instance_id for i in directory.instances_named("web-0", expecting="100")] == ["100"]

    # WHEN web-0 is deleted and made again (a new id), and its first token arrives at once
    compute.api.given(ZONE_B, "web-0", "101")
    clock.now += 10
    # THEN the cached answer stands for a minute (a stream of unknown ids costs one listing a minute)
    assert [i.instance_id for i in directory.instances_named("web-0", expecting="101")] == ["100"]
    clock.now += 50
    assert [i.instance_id for i in directory.instances_named("web-0", expecting="101")] == ["101"]
    # AND a known id, or no id, is answered from the cache until 15 minutes have passed
    clock.now += 60
    assert [i.instance_id for i in directory.instances_named("web-0", expecting="101")] == ["101"]
    assert [i.instance_id for i in directory.instances_named("web-0")] == ["101"]
    assert len(listings(compute)) == 2
    clock.now += 900
    directory.instances_named("web-0")
    assert len(listings(compute)) == 3


def test_known_instances_are_served_while_the_api_fails_and_unknown_names_are_retried(compute: Fixture) -> None:
    clock = Ticks()
    compute.api.given(ZONE_B, "web-0", "100")
    directory = directory_with(compute, clock)
    directory.instances_named("web-0")

    # WHEN the API fails as the listing is out of date
    compute.api.fail["aggregated/instances"] = [(503, "backendError")] * 5
    clock.now += 900
    # THEN the known instance is served, and the failed listing is not tried again for a minute
    assert [i.instance_id for i in directory.instances_named("web-0")] == ["100"]
    assert [i.instance_id for i in directory.instances_named("web-0")] == ["100"]
    assert len(listings(compute)) == 2
    # AND a name never listed is retried by the platform: nothing is known to serve
    with pytest.raises(RetryableError, match="web-1"):
        directory.instances_named("web-1")


def test_a_refused_listing_is_permanent_and_names_the_permission_and_role(compute: Fixture) -> None:
    compute.api.fail["aggregated/instances"] = [(403, "forbidden")]
    with pytest.raises(PermanentError, match=rf"compute\.instances\.list on project {PROJECT}.*mbridgeInstanceReader"):
        directory_with(compute, Ticks()).instances_named("web-0")


def test_a_directory_without_projects_cannot_be_made() -> None:
    with pytest.raises(ValueError, match="project"):
        ComputeInstanceDirectory(compute_v1.InstancesClient(credentials=anonymous()), ())
