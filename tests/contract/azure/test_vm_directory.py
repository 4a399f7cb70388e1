"""ComputeVmDirectory with the real ComputeManagementClient against a local ARM stand-in over HTTPS.

The stand-in (`FakeCompute`) serves the list endpoints the directory reads, in the shapes ARM
returns them: VMs and scale sets of a subscription or of a resource group, and the instances of
a scale set, two to a page with a `nextLink` carrying `$skiptoken` like ARM's. It records every
request, so the tests assert what was asked and how often.

azure-mgmt-compute sends bearer tokens over HTTPS only: the server uses the self-signed
certificate of the load balancer tests, and the client trusts exactly that certificate.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from azure.core.credentials import AccessToken, TokenCredential
from azure.mgmt.compute import ComputeManagementClient
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from functions.azure_app import settings as names
from functions.azure_app.autohealer import scale_set_repairs
from functions.azure_app.settings import Settings, SettingsError
from functions.azure_app.vm_directory import (
    ComputeVmDirectory,
    StaticVmDirectory,
    VmDirectoryConfigError,
    VmDirectoryUnavailableError,
    vm_directory,
)
from functions.core.ports import JsonObject
from functions.trust.azure_attested import load_certificates
from functions.trust.verifiers import AzureAttestedVerifier, VmDirectory
from simulator.attestation import AttestationAuthority
from tests.contract.azure.test_load_balancer import TOKEN, StaticToken, _self_signed
from tests.factories import azure_event
from tests.kit import FakeClock
from tests.peers import free_port
from wire.envelope import decode, encode, envelope_for_event
from wire.errors import PermanentError, RetryableError
from wire.identity import (
    AZURE_ATTESTED,
    AZURE_SESSION_KEY,
    AZURE_SIGNATURE,
    UnverifiedError,
    session_nonce,
    signed_digest,
)
from wire.model import EventKind, EventStatus

SUB = "6f1c2d9e-0000-4000-8000-00000000c0de"
OTHER_SUB = "0b7e4a31-1111-4000-8000-0000000000aa"
UNKNOWN = "9d0f5c3e-7b1a-4e62-8f0d-000000000000"
API_VERSION = "2024-07-01"
PAGE = 2  # items per page: every list of three or more is paged

# vmIds: ARM writes them in lower case; one is upper case here, as an older VM may have it.
WEB_0 = "3f2a8c1e-5b7d-4e9a-a1c3-0d4e5f6a7b80"
WEB_1 = "3F2A8C1E-5B7D-4E9A-A1C3-0D4E5F6A7B81"
WEB_2 = "3f2a8c1e-5b7d-4e9a-a1c3-0d4e5f6a7b82"
FLEX_VM = "7c1d2e3f-4a5b-4c6d-8e7f-8091a2b3c4d5"
WORKER_0, WORKER_3, WORKER_4 = (f"b8e0d6a4-2c1f-4d3e-9a7b-6c5d4e3f2a{n:02d}" for n in (0, 3, 4))
OLD_1 = "e4d3c2b1-a098-4765-8432-10fedcba9801"
DB_0 = "5a6b7c8d-9e0f-4a1b-8c2d-3e4f5a6b7c8d"


# ---------------------------------------------------------------- ARM shapes


def _arm_id(group: str, kind: str, name: str) -> str:
    return f"/subscriptions/{SUB}/resourceGroups/{group}/providers/Microsoft.Compute/{kind}/{name}"


def vm(group: str, name: str, vm_id: str, scale_set: str | None = None) -> JsonObject:
    """A VM as GET .../virtualMachines lists it (trimmed of fields the directory never reads)."""
    vm_arm_id = _arm_id(group, "virtualMachines", name)
    document: JsonObject = {
        "name": name,
        "id": vm_arm_id,
        "type": "Microsoft.Compute/virtualMachines",
        "location": "westeurope",
        "tags": {"app": "web"},
        "properties": {
            "vmId": vm_id,
            "hardwareProfile": {"vmSize": "Standard_D2s_v5"},
            "storageProfile": {
                "imageReference": {
                    "publisher": "Canonical",
                    "offer": "ubuntu-24_04-lts",
                    "sku": "server",
                    "version": "latest",
                    "exactVersion": "24.04.202601080",
                },
                "osDisk": {
                    "osType": "Linux",
                    "name": f"{name}-osdisk",
                    "createOption": "FromImage",
                    "caching": "ReadWrite",
                    "managedDisk": {
                        "storageAccountType": "Premium_LRS",
                        "id": _arm_id(group, "disks", f"{name}-osdisk"),
                    },
                    "deleteOption": "Delete",
                    "diskSizeGB": 30,
                },
                "dataDisks": [],
            },
            "osProfile": {
                "computerName": name,
                "adminUsername": "azureuser",
                "linuxConfiguration": {"disablePasswordAuthentication": True, "provisionVMAgent": True},
                "secrets": [],
                "allowExtensionOperations": True,
            },
            "networkProfile": {
                "networkInterfaces": [
                    {
                        "id": f"/subscriptions/{SUB}/resourceGroups/{group}/providers/Microsoft.Network"
                        f"/networkInterfaces/{name}-nic"
                    }
                ]
            },
            "provisioningState": "Succeeded",
            "timeCreated": "2026-01-05T09:12:44.1234567+00:00",
        },
    }
    if scale_set is not None:
        document["properties"]["virtualMachineScaleSet"] = {"id": _arm_id(group, "virtualMachineScaleSets", scale_set)}
    return document


def scale_set(group: str, name: str, mode: str | None) -> JsonObject:
    """A scale set; `mode` None: one made before orchestration modes existed (uniform)."""
    document: JsonObject = {
        "name": name,
        "id": _arm_id(group, "virtualMachineScaleSets", name),
        "type": "Microsoft.Compute/virtualMachineScaleSets",
        "location": "westeurope",
        "sku": {"name": "Standard_D2s_v5", "tier": "Standard", "capacity": 3},
        "properties": {
            "singlePlacementGroup": False,
            "upgradePolicy": {"mode": "Manual"},
            "provisioningState": "Succeeded",
            "overprovision": False,
            "uniqueId": "c0ffee00-1234-4abc-9def-0123456789ab",
            "platformFaultDomainCount": 1,
            "timeCreated": "2025-11-20T16:02:10.5550000+00:00",
        },
    }
    if mode is not None:
        document["properties"]["orchestrationMode"] = mode
    return document


def instance(group: str, scale_set_name: str, instance_id: int, vm_id: str) -> JsonObject:
    """An instance of a uniform scale set, as GET .../virtualMachineScaleSets/{name}/virtualMachines lists it."""
    return {
        "name": f"{scale_set_name}_{instance_id}",
        "id": f"{_arm_id(group, 'virtualMachineScaleSets', scale_set_name)}/virtualMachines/{instance_id}",
        "type": "Microsoft.Compute/virtualMachineScaleSets/virtualMachines",
        "location": "westeurope",
        "instanceId": str(instance_id),
        "sku": {"name": "Standard_D2s_v5", "tier": "Standard"},
        "properties": {
            "vmId": vm_id,
            "latestModelApplied": True,
            "modelDefinitionApplied": "VirtualMachineScaleSet",
            "hardwareProfile": {},
            "osProfile": {"computerName": f"{scale_set_name}{instance_id:06d}", "adminUsername": "azureuser"},
            "provisioningState": "Succeeded",
            "timeCreated": "2025-11-20T16:04:31.1230000+00:00",
        },
    }


# ---------------------------------------------------------------- the ARM stand-in

_SUBSCRIPTION_LIST = re.compile(
    r"^/subscriptions/([^/]+)/providers/microsoft\.compute/(virtualmachines|virtualmachinescalesets)$"
)
_GROUP_LIST = re.compile(
    r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.compute/(virtualmachines|virtualmachinescalesets)$"
)
_INSTANCE_LIST = re.compile(
    r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.compute/virtualmachinescalesets/([^/]+)/virtualmachines$"
)


@dataclass
class Fault:
    """Once, for the next request whose path contains `path_part`: answer `status`."""

    path_part: str
    status: int


@dataclass
class FakeCompute:
    """The VMs, scale sets and scale set instances of subscription SUB; other subscriptions are empty."""

    groups: set[str] = field(default_factory=set)  # lower-case names of the groups that exist
    vms: list[JsonObject] = field(default_factory=list)
    scale_sets: list[JsonObject] = field(default_factory=list)
    instances: dict[str, list[JsonObject]] = field(default_factory=dict)  # lower-case scale set id → instances
    requests: list[str] = field(default_factory=list)  # path?query of every request
    faults: list[Fault] = field(default_factory=list)
    base_url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_vm(self, document: JsonObject) -> None:
        with self.lock:
            self.groups.add(_group_of(document).lower())
            self.vms.append(document)

    def add_scale_set(self, document: JsonObject, members: list[JsonObject]) -> None:
        with self.lock:
            self.groups.add(_group_of(document).lower())
            self.scale_sets.append(document)
            self.instances[document["id"].lower()] = members

    def remove_vm(self, name: str) -> None:
        with self.lock:
            self.vms = [document for document in self.vms if document["name"] != name]

    def paths(self) -> list[str]:
        with self.lock:
            return [urlsplit(request).path for request in self.requests]

    def handle(self, path: str, query: str, authorization: str | None) -> tuple[int, JsonObject]:
        with self.lock:
            self.requests.append(f"{path}?{query}")
            for fault in self.faults:
                if fault.path_part.lower() in path.lower():
                    self.faults.remove(fault)
                    return fault.status, _error(fault.status)
            if authorization != f"Bearer {TOKEN}":
                return 401, _error(401)
            items = self._items(path.lower())
            if items is None:
                return 404, _error(404)
            return 200, self._page(path, query, items)

    def _items(self, key: str) -> list[JsonObject] | None:
        if match := _SUBSCRIPTION_LIST.match(key):
            subscription, kind = match.groups()
            return self._of_kind(kind) if subscription == SUB else []
        if match := _GROUP_LIST.match(key):
            subscription, group, kind = match.groups()
            if subscription != SUB or group not in self.groups:
                return None  # ResourceGroupNotFound
            return [document for document in self._of_kind(kind) if _group_of(document).lower() == group]
        if match := _INSTANCE_LIST.match(key):
            return self.instances.get(key.rsplit("/virtualmachines", 1)[0])
        return None

    def _of_kind(self, kind: str) -> list[JsonObject]:
        return list(self.vms if kind == "virtualmachines" else self.scale_sets)

    def _page(self, path: str, query: str, items: list[JsonObject]) -> JsonObject:
        start = int(parse_qs(query).get("$skiptoken", ["0"])[0])
        page: JsonObject = {"value": items[start : start + PAGE]}
        if start + PAGE < len(items):
            page["nextLink"] = f"{self.base_url}{path}?api-version={API_VERSION}&$skiptoken={start + PAGE}"
        return page


def _group_of(document: JsonObject) -> str:
    parts = document["id"].split("/")
    return str(parts[[part.lower() for part in parts].index("resourcegroups") + 1])


def _error(status: int) -> JsonObject:
    codes = {
        401: "AuthenticationFailed",
        403: "AuthorizationFailed",
        404: "ResourceGroupNotFound",
        429: "TooManyRequests",
        500: "InternalServerError",
        503: "ServiceUnavailable",
    }
    code = codes.get(status, "Error")
    return {"error": {"code": code, "message": f"{code} (from the test's ARM stand-in)"}}


def _handler(arm: FakeCompute) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            status, document = arm.handle(url.path, url.query, self.headers.get("Authorization"))
            payload = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("x-ms-request-id", "00000000-0000-0000-0000-000000000000")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep the test output clean

    return Handler


class WrongToken:
    """A credential whose token ARM does not accept (an identity of another tenant, say)."""

    def get_token(
        self,
        *scopes: str,
        claims: str | None = None,
        tenant_id: str | None = None,
        enable_cae: bool = False,
        **kwargs: Any,
    ) -> AccessToken:
        return AccessToken("not-the-token", int(time.time()) + 3600)


@dataclass
class Arm:
    fake: FakeCompute
    base_url: str
    certificate: Path
    clock: FakeClock = field(default_factory=lambda: FakeClock(monotonic=1000.0))
    created: list[ComputeVmDirectory] = field(default_factory=list)
    subscriptions: list[str] = field(default_factory=list)  # the client factory's calls

    def client(self, subscription: str, credential: TokenCredential | None = None) -> ComputeManagementClient:
        self.subscriptions.append(subscription)
        return ComputeManagementClient(
            credential or StaticToken(),
            subscription,
            base_url=self.base_url,
            connection_verify=str(self.certificate),
            retry_total=0,  # one answer per request: the directory's mapping is under test, not the SDK's retries
        )

    def directory(self, credential: TokenCredential | None = None, **options: Any) -> ComputeVmDirectory:
        directory = ComputeVmDirectory(
            client_factory=lambda subscription: self.client(subscription, credential),
            clock=self.clock.monotonic,
            **options,
        )
        self.created.append(directory)
        return directory


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _self_signed(tmp_path_factory.mktemp("arm-tls"))


def populate(fake: FakeCompute) -> None:
    """rg-web: three standalone VMs. rg-batch: a flexible scale set's VM and a uniform scale set of
    three instances. rg-legacy: a scale set older than orchestration modes. rg-db: one VM."""
    for name, vm_id in (("web-0", WEB_0), ("web-1", WEB_1), ("web-2", WEB_2)):
        fake.add_vm(vm("rg-web", name, vm_id))
    fake.add_vm(vm("rg-batch", "flex_5d1e0c2a", FLEX_VM, scale_set="flex"))
    fake.add_scale_set(scale_set("rg-batch", "flex", "Flexible"), [])
    fake.add_scale_set(
        scale_set("rg-batch", "workers", "Uniform"),
        [instance("rg-batch", "workers", n, vm_id) for n, vm_id in ((0, WORKER_0), (3, WORKER_3), (4, WORKER_4))],
    )
    fake.add_scale_set(scale_set("rg-legacy", "old", None), [instance("rg-legacy", "old", 1, OLD_1)])
    fake.add_vm(vm("rg-db", "db-0", DB_0))


@pytest.fixture
def arm(certificate: tuple[Path, Path]) -> Iterator[Arm]:
    cert_path, key_path = certificate
    fake = FakeCompute()
    populate(fake)
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _handler(fake))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    fake.base_url = f"https://127.0.0.1:{server.server_address[1]}"
    state = Arm(fake, fake.base_url, cert_path)
    try:
        yield state
    finally:
        for directory in state.created:
            directory.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _instance_lists(arm: Arm) -> list[str]:
    return [
        path
        for path in arm.fake.paths()
        if path.lower().endswith("/virtualmachines") and "/virtualMachineScaleSets/" in path
    ]


# ---------------------------------------------------------------- names


def test_a_standalone_vm_and_scale_set_instances_are_named_from_one_paged_listing(arm: Arm) -> None:
    # GIVEN a directory over the whole subscription
    directory = arm.directory()

    # WHEN the vmIds of a standalone VM, a flexible scale set's VM and uniform instances are looked up
    found = {vm_id: directory.name_of(SUB, vm_id) for vm_id in (WEB_0, WEB_2, FLEX_VM, WORKER_3, WORKER_4, OLD_1, DB_0)}

    # THEN each gets its resource name (an instance: <scale set>_<instance id>)
    assert found == {
        WEB_0: "web-0",
        WEB_2: "web-2",
        FLEX_VM: "flex_5d1e0c2a",
        WORKER_3: "workers_3",
        WORKER_4: "workers_4",
        OLD_1: "old_1",
        DB_0: "db-0",
    }
    # ... from one listing that followed the nextLinks (ARM's api-version and $skiptoken kept)
    assert any("$skiptoken=2" in request and f"api-version={API_VERSION}" in request for request in arm.fake.requests)
    paths = arm.fake.paths()
    assert paths.count(f"/subscriptions/{SUB}/providers/Microsoft.Compute/virtualMachines") == 3  # 5 VMs, 2 a page
    # ... and a flexible scale set's instances are not asked for (its VMs are in the VM list)
    assert sorted(_instance_lists(arm)) == sorted(
        [
            f"/subscriptions/{SUB}/resourceGroups/rg-batch/providers/Microsoft.Compute/virtualMachineScaleSets/workers/virtualMachines",
            f"/subscriptions/{SUB}/resourceGroups/rg-batch/providers/Microsoft.Compute/virtualMachineScaleSets/workers/virtualMachines",
            f"/subscriptions/{SUB}/resourceGroups/rg-legacy/providers/Microsoft.Compute/virtualMachineScaleSets/old/virtualMachines",
        ]
    )


def test_vm_ids_are_compared_case_insensitively(arm: Arm) -> None:
    # GIVEN ARM listing one vmId in upper case and the others in lower case
    directory = arm.directory()

    # WHEN they are looked up in the other case, or in the same one
    # THEN the same VM is found
    assert directory.name_of(SUB, WEB_1.lower()) == "web-1"
    assert directory.name_of(SUB, WEB_1) == "web-1"
    assert directory.name_of(SUB.upper(), WORKER_0.upper()) == "workers_0"
    assert directory.name_of(SUB, f" {WEB_0.upper()} ") == "web-0"


def test_a_vm_id_is_looked_up_in_its_own_subscription_only(arm: Arm) -> None:
    # GIVEN a directory asked about two subscriptions
    directory = arm.directory()

    # WHEN a vmId of SUB is looked up in another subscription
    # THEN it is not found there, each subscription got its own client, once
    assert directory.name_of(OTHER_SUB, WEB_0) is None
    assert directory.name_of(SUB, WEB_0) == "web-0"
    assert directory.name_of(OTHER_SUB, WEB_1) is None
    assert arm.subscriptions == [OTHER_SUB, SUB]


def test_what_is_not_a_guid_names_no_vm_and_asks_arm_nothing(arm: Arm) -> None:
    directory = arm.directory()

    assert directory.name_of("../../providers", WEB_0) is None
    assert directory.name_of(SUB, "web-0") is None
    assert arm.fake.requests == []


# ---------------------------------------------------------------- the cache


def test_an_unknown_vm_id_is_none_and_lists_at_most_once_per_min_refresh(arm: Arm) -> None:
    # GIVEN a directory that has listed the VMs for an unknown vmId
    directory = arm.directory(min_refresh_seconds=60, max_age_seconds=900)
    assert directory.name_of(SUB, UNKNOWN) is None
    listed = len(arm.fake.requests)

    # WHEN it is asked again, about it and about known VMs, within a minute
    arm.clock.advance(59)
    again = [directory.name_of(SUB, UNKNOWN), directory.name_of(SUB, WEB_0), directory.name_of(SUB, UNKNOWN)]

    # THEN the answers come from the map, and ARM is not asked again
    assert again == [None, "web-0", None]
    assert len(arm.fake.requests) == listed

    # ... until the minute is over: then a miss lists again, once
    arm.clock.advance(1)
    assert directory.name_of(SUB, UNKNOWN) is None
    assert directory.name_of(SUB, UNKNOWN) is None
    assert len(arm.fake.requests) == 2 * listed


def test_a_vm_created_later_is_found_after_min_refresh(arm: Arm) -> None:
    # GIVEN a directory that has listed the VMs, and then a VM created
    directory = arm.directory(min_refresh_seconds=60)
    assert directory.name_of(SUB, WEB_0) == "web-0"
    new_vm = "1d2c3b4a-0000-4000-8000-00000000beef"
    arm.fake.add_vm(vm("rg-web", "web-3", new_vm))

    # WHEN it reports at once, and again a minute later
    arm.clock.advance(10)
    at_once = directory.name_of(SUB, new_vm)
    arm.clock.advance(50)
    later = directory.name_of(SUB, new_vm)

    # THEN it is unknown at first (no listing within the minute), and found after
    assert (at_once, later) == (None, "web-3")


def test_the_map_is_listed_again_after_max_age_even_for_known_vms(arm: Arm) -> None:
    # GIVEN a directory that has listed the VMs, and web-2 deleted since
    directory = arm.directory(min_refresh_seconds=60, max_age_seconds=900)
    assert directory.name_of(SUB, WEB_2) == "web-2"
    listed = len(arm.fake.requests)
    arm.fake.remove_vm("web-2")

    # WHEN web-0 is looked up before and after max_age
    arm.clock.advance(899)
    assert directory.name_of(SUB, WEB_0) == "web-0"
    assert len(arm.fake.requests) == listed
    arm.clock.advance(1)
    assert directory.name_of(SUB, WEB_0) == "web-0"

    # THEN the map was listed again, and the deleted VM is gone from it
    assert len(arm.fake.requests) > listed
    assert directory.name_of(SUB, WEB_2) is None


def test_a_known_vm_keeps_its_name_when_the_refresh_due_to_age_fails(arm: Arm) -> None:
    # GIVEN a directory whose map is older than max_age, and ARM failing for a while
    directory = arm.directory(min_refresh_seconds=60, max_age_seconds=900)
    assert directory.name_of(SUB, WEB_0) == "web-0"
    arm.clock.advance(900)
    arm.fake.faults.append(Fault("/virtualMachines", 503))
    before = len(arm.fake.requests)

    # WHEN a known VM is looked up, and again a moment later
    # THEN it keeps its name (a VM's name never changes), and ARM is asked once, not on every lookup
    assert directory.name_of(SUB, WEB_0) == "web-0"
    arm.clock.advance(30)
    assert directory.name_of(SUB, WEB_0) == "web-0"
    assert len(arm.fake.requests) == before + 1

    # ... while an unknown vmId cannot be answered and is retried later
    arm.fake.faults.append(Fault("/virtualMachines", 503))
    with pytest.raises(VmDirectoryUnavailableError):
        directory.name_of(SUB, UNKNOWN)


def test_concurrent_lookups_on_an_empty_map_list_once(arm: Arm) -> None:
    # GIVEN a directory nothing was asked of yet
    directory = arm.directory()
    start = threading.Barrier(8)
    answers: list[str | None] = []

    def look_up(vm_id: str) -> None:
        start.wait()
        answers.append(directory.name_of(SUB, vm_id))

    # WHEN eight invocations look up VMs at the same moment
    threads = [threading.Thread(target=look_up, args=(vm_id,)) for vm_id in [WEB_0, WORKER_3, UNKNOWN, DB_0] * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    # THEN they share one listing (the VM list has three pages)
    assert sorted(answers, key=str) == sorted(["web-0", "workers_3", None, "db-0"] * 2, key=str)
    assert arm.fake.paths().count(f"/subscriptions/{SUB}/providers/Microsoft.Compute/virtualMachines") == 3


# ---------------------------------------------------------------- resource groups


def test_only_the_configured_resource_groups_are_listed(arm: Arm) -> None:
    # GIVEN a directory limited to rg-web and rg-batch (named in another case than ARM's)
    directory = arm.directory(resource_groups=("rg-web", "RG-BATCH"))

    # WHEN VMs of those groups and of another are looked up
    found = [directory.name_of(SUB, vm_id) for vm_id in (WEB_0, FLEX_VM, WORKER_4, DB_0, OLD_1)]

    # THEN those of the groups are found, the others are not
    assert found == ["web-0", "flex_5d1e0c2a", "workers_4", None, None]
    # ... and only those groups' URLs were requested, never a subscription-wide list
    paths = arm.fake.paths()
    assert paths
    for path in paths:
        where = rf"^/subscriptions/{SUB}/resourceGroups/(rg-web|rg-batch)/providers/Microsoft\.Compute/"
        assert re.match(where, path, re.IGNORECASE), path
    assert f"/subscriptions/{SUB}/resourceGroups/rg-web/providers/Microsoft.Compute/virtualMachineScaleSets" in paths


def test_a_resource_group_that_is_not_there_has_no_vms(arm: Arm, caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN a directory over rg-web and a group that was deleted
    directory = arm.directory(resource_groups=("rg-gone", "rg-web"))

    # WHEN a VM of rg-web is looked up
    with caplog.at_level(logging.WARNING, logger="mbridge.functions.azure.vm_directory"):
        assert directory.name_of(SUB, WEB_0) == "web-0"

    # THEN the missing group is skipped, with a warning naming the setting
    assert "resource group rg-gone of MBRIDGE_TRUST_RESOURCE_GROUPS is not in subscription" in caplog.text


def test_the_factory_takes_the_resource_groups_from_the_settings() -> None:
    environ = {
        names.EVENTS_TOPIC: "maintenance-events",
        names.EVENTS_SUBSCRIPTION: "functions",
        names.SERVICEBUS_NAMESPACE: "mybus.servicebus.windows.net",
        names.TABLE_ENDPOINT: "https://myaccount.table.core.windows.net",
        names.TRUST_SUBSCRIPTIONS: SUB,
    }
    limited = vm_directory(
        Settings.from_env({**environ, names.TRUST_RESOURCE_GROUPS: "rg-web,rg-batch"}), StaticToken()
    )
    assert limited.resource_groups == ("rg-web", "rg-batch")

    # AND without resource groups the app does not start: a whole subscription would let a sandbox VM
    # named like a production one speak for it
    with pytest.raises(SettingsError, match="MBRIDGE_TRUST_RESOURCE_GROUPS is not set"):
        Settings.from_env(environ)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("resource_groups", "role"),
    [
        ((), f"grant the function app's identity the built-in role Reader on subscription {SUB} "),
        (
            ("rg-web", "rg-batch"),
            f"grant the function app's identity the built-in role Reader on the resource group\\(s\\) rg-web, "
            f"rg-batch of subscription {SUB}",
        ),
    ],
)
def test_a_refused_listing_is_permanent_and_names_the_role(
    arm: Arm, resource_groups: tuple[str, ...], role: str
) -> None:
    # GIVEN ARM refusing the identity the VM list (403 AuthorizationFailed)
    arm.fake.faults.append(Fault("/virtualMachines", 403))

    # WHEN a vmId is looked up
    # THEN the error is permanent and names the role to grant, and where
    with pytest.raises(
        VmDirectoryConfigError, match=rf"not authorised to list the VMs .*\(HTTP 403\): {role}"
    ) as caught:
        arm.directory(resource_groups=resource_groups).name_of(SUB, WEB_0)
    assert isinstance(caught.value, PermanentError)


def test_a_token_arm_does_not_accept_is_permanent_and_names_the_role(arm: Arm) -> None:
    with pytest.raises(VmDirectoryConfigError, match=r"authentication to Azure Resource Manager failed.*Reader on"):
        arm.directory(WrongToken()).name_of(SUB, WEB_0)


@pytest.mark.parametrize(
    ("path_part", "status"),
    [
        ("/providers/Microsoft.Compute/virtualMachines", 503),
        ("/providers/Microsoft.Compute/virtualMachineScaleSets", 429),
        ("/virtualMachineScaleSets/workers/virtualMachines", 500),
    ],
)
def test_throttling_and_server_errors_are_retryable_and_keep_nothing(arm: Arm, path_part: str, status: int) -> None:
    # GIVEN ARM failing one of the lists once
    directory = arm.directory()
    arm.fake.faults.append(Fault(path_part, status))

    # WHEN a vmId is looked up
    # THEN the invocation fails for a redelivery
    with pytest.raises(
        VmDirectoryUnavailableError, match=rf"cannot list the VMs of subscription {SUB} now \(HTTP {status}\)"
    ):
        directory.name_of(SUB, WORKER_3)

    # ... and the redelivery lists again (no half-read map was kept) and finds the VM
    assert directory.name_of(SUB, WORKER_3) == "workers_3"


def test_an_unreachable_arm_is_retryable(certificate: tuple[Path, Path]) -> None:
    # GIVEN clients pointed at a port nobody listens on
    port = free_port()
    directory = ComputeVmDirectory(
        client_factory=lambda subscription: ComputeManagementClient(
            StaticToken(),
            subscription,
            base_url=f"https://127.0.0.1:{port}",
            connection_verify=str(certificate[0]),
            retry_total=0,
        )
    )

    # WHEN a vmId is looked up
    # THEN it is retried later
    with pytest.raises(VmDirectoryUnavailableError, match="cannot reach Azure Resource Manager") as caught:
        directory.name_of(SUB, WEB_0)
    assert isinstance(caught.value, RetryableError)
    directory.close()


# ---------------------------------------------------------------- the static directory


def test_the_static_directory_names_vms_per_subscription_case_insensitively() -> None:
    directory = StaticVmDirectory({SUB.upper(): {WEB_1: "web-1", WORKER_3: "workers_3"}})
    port: VmDirectory = directory

    assert directory.name_of(SUB, WEB_1.lower()) == "web-1"
    assert directory.name_of(SUB.lower(), WORKER_3.upper()) == "workers_3"
    assert directory.name_of(OTHER_SUB, WEB_1) is None
    assert port.resource_of(SUB, UNKNOWN) is None
    assert [record.vm_id for record in port.named("WEB-1")] == [WEB_1.lower()]


# ---------------------------------------------------------------- a name is one VM of the scope

SANDBOX_WEB_0 = "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f"


def attested_report(vm_id: str, at: datetime) -> tuple[bytes, AttestationAuthority]:
    """A report of web-0's Reboot with the proof an agent on the VM of `vm_id` attaches: a document
    signed by a PKI the verifier trusts (the simulator's), for that agent's key."""
    authority = AttestationAuthority.generate(at)
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    document = authority.sign(vm_id, SUB, session_nonce(public), at)["signature"]
    event = azure_event(event_id="E-1", kind=EventKind.REBOOT, status=EventStatus.SCHEDULED, reporter="web-0")
    envelope = envelope_for_event(replace(event, resources=("web-0",)), at)
    body = json.loads(encode(envelope))
    body[AZURE_ATTESTED] = document
    body[AZURE_SESSION_KEY] = base64.b64encode(public).decode()
    body[AZURE_SIGNATURE] = base64.b64encode(key.sign(signed_digest(envelope.digest))).decode()
    return json.dumps(body).encode(), authority


def verifier(directory: VmDirectory, authority: AttestationAuthority) -> AzureAttestedVerifier:
    return AzureAttestedVerifier(
        roots=load_certificates(authority.roots_pem()),
        intermediates=load_certificates(authority.intermediates_pem()),
        subscriptions=[SUB],
        directory=directory,
    )


def test_a_sandbox_vm_named_like_a_production_one_cannot_speak_for_it(arm: Arm) -> None:
    # GIVEN production's web-0 in rg-web, and a sandbox VM also named web-0 in rg-sandbox, whose
    # agent sends a genuine proof of itself with a report in web-0's name
    arm.fake.add_vm(vm("rg-sandbox", "web-0", SANDBOX_WEB_0))
    at = datetime.now(timezone.utc)
    body, authority = attested_report(SANDBOX_WEB_0, at)

    # WHEN the deployment's scope is rg-web: THEN the sandbox VM is nobody
    scoped = verifier(arm.directory(resource_groups=("rg-web",)), authority)
    with pytest.raises(UnverifiedError, match="is in this deployment's scope"):
        scoped.verify(decode(body), at, at)

    # AND WHEN the scope holds both groups: THEN the name is two VMs, and neither report is taken
    both = arm.directory(resource_groups=("rg-web", "rg-sandbox"))
    with pytest.raises(UnverifiedError, match=r"is named 'web-0' like .*resourceGroups/rg-web/"):
        verifier(both, authority).verify(decode(body), at, at)
    production, authority = attested_report(WEB_0, at)
    with pytest.raises(UnverifiedError, match="rename one"):
        verifier(both, authority).verify(decode(production), at, at)


def test_the_verified_vm_is_named_by_its_full_resource_id(arm: Arm) -> None:
    arm.fake.add_vm(vm("rg-sandbox", "web-0", SANDBOX_WEB_0))
    at = datetime.now(timezone.utc)
    body, authority = attested_report(WEB_0, at)

    identity = verifier(arm.directory(resource_groups=("rg-web",)), authority).verify(decode(body), at, at)

    assert (identity.vm, identity.resource) == ("web-0", _arm_id("rg-web", "virtualMachines", "web-0"))


def test_a_vms_record_carries_the_nic_ids_of_its_network_profile(arm: Arm) -> None:
    # the load balancer reads these NICs one by one instead of listing the NIC group per drain
    record = arm.directory().resource_of(SUB, WEB_0)
    assert record is not None
    assert record.nic_ids == (
        f"/subscriptions/{SUB}/resourceGroups/rg-web/providers/Microsoft.Network/networkInterfaces/web-0-nic",
    )


# ---------------------------------------------------------------- automatic repairs (docs/azure.md#autohealers)

HEALED, FLEET_0 = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c01", "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c02"


def repaired(document: JsonObject, protocol: str, path: str, port: int) -> JsonObject:
    """The scale set with automatic instance repairs on an Application Health extension's probe."""
    document["properties"]["automaticRepairsPolicy"] = {"enabled": True, "gracePeriod": "PT10M"}
    document["properties"]["virtualMachineProfile"] = {
        "extensionProfile": {
            "extensions": [
                {
                    "name": "health",
                    "properties": {
                        "publisher": "Microsoft.ManagedServices",
                        "type": "ApplicationHealthLinux",
                        "typeHandlerVersion": "2.0",
                        "settings": {"protocol": protocol, "port": port, "requestPath": path},
                    },
                }
            ]
        }
    }
    return document


def test_a_drain_a_scale_sets_repairs_would_act_on_is_refused_from_the_listing(arm: Arm) -> None:
    # GIVEN a flexible scale set repairing on the agent's /readyz, a uniform one on the application's
    # own check, and the standalone VMs
    arm.fake.add_scale_set(repaired(scale_set("rg-heal", "healed", "Flexible"), "http", "/readyz", 9797), [])
    arm.fake.add_vm(vm("rg-heal", "healed_1a2b", HEALED, scale_set="healed"))
    fleet = repaired(scale_set("rg-heal", "fleet", "Uniform"), "https", "/health", 443)
    arm.fake.add_scale_set(fleet, [instance("rg-heal", "fleet", 0, FLEET_0)])
    directory = arm.directory(subscriptions=(SUB,))
    guard = scale_set_repairs(directory)

    # THEN each VM's record says what its scale set's repairs probe, from the one listing
    assert [record.repairs_probe for record in directory.named("healed_1a2b")] == [("http", "/readyz", 9797)]
    assert [record.repairs_probe for record in directory.named("fleet_0")] == [("https", "/health", 443)]
    assert [record.repairs_probe for record in directory.named("web-0")] == [None]
    # AND only the drain that would get its VM repaired is refused, saying what to change
    refused = guard("healed_1a2b")
    assert refused is not None
    assert "automatic instance repairs on its Application Health extension (http /readyz on port 9797)" in refused
    assert (guard("fleet_0"), guard("web-0")) == (None, None)
