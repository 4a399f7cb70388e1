"""AzureLoadBalancer with the real NetworkManagementClient against a local ARM stand-in over HTTPS.

The stand-in (`FakeArm`) serves what the adapter reads and writes, in the shapes ARM returns
(NIC list, NIC GET/PUT, backend pool list/GET/PUT); a PUT answers 200 with provisioningState
Succeeded, so the long-running operation completes at once. It honours If-Match like ARM (412
when the resource changed) and records every request, so the tests assert the PUT bodies.

azure-mgmt-network sends bearer tokens over HTTPS only, so the server uses a self-signed
certificate the test makes with `cryptography`, and the client trusts exactly that certificate.
"""

from __future__ import annotations

import copy
import datetime as dt
import ipaddress
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from azure.core.credentials import AccessToken
from azure.mgmt.network import NetworkManagementClient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from functions.azure_app.load_balancer import (
    WRITE_ATTEMPTS,
    AzureLoadBalancer,
    LoadBalancerConfigError,
    LoadBalancerUnavailableError,
    nics_in_resource_group,
    nics_of_scoped_vm,
)
from functions.azure_app.vm_directory import StaticVmDirectory
from functions.core.ports import JsonObject
from tests.peers import free_port
from wire.errors import PermanentError

SUB = "6f1c2d9e-0000-4000-8000-00000000c0de"
RG = "rg-web"
LB = "lb-web"
TOKEN = "test-token"  # noqa: S105  (a bearer token for the local ARM stand-in only)
ARM_ID = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network"
VNET = f"{ARM_ID}/virtualNetworks/vnet-web"
SUBNET = f"{VNET}/subnets/default"
POOL_HTTP = f"{ARM_ID}/loadBalancers/{LB}/backendAddressPools/pool-http"
POOL_IP = f"{ARM_ID}/loadBalancers/{LB}/backendAddressPools/pool-ip"
OTHER_LB_POOL = f"{ARM_ID}/loadBalancers/lb-internal/backendAddressPools/pool-x"
THREE_ENTRIES = [("web-0-addr", "10.0.1.4"), ("web-1-addr", "10.0.1.5"), ("web-2-addr", "10.0.1.6")]
WEB_0_NIC = f"{ARM_ID}/networkInterfaces/web-0-nic"
# The memento of web-0 in pool-http (by its NIC) and in pool-ip (by its IP, the first of THREE_ENTRIES).
WEB_0_IN_BOTH: JsonObject = {
    "nic": [{"nic_id": WEB_0_NIC, "ip_configuration": "ipconfig1", "pools": [POOL_HTTP]}],
    "ip": [
        {"pool_id": POOL_IP, "address": {"name": "web-0-addr", "ip_address": "10.0.1.4", "virtual_network_id": VNET}}
    ],
}


# ---------------------------------------------------------------- ARM shapes


def nic(name: str, vm: str | None, ip: str, pools: list[str]) -> JsonObject:
    """A NIC as GET networkInterfaces returns it (trimmed of fields the adapter never reads)."""
    nic_id = f"{ARM_ID}/networkInterfaces/{name}"
    document: JsonObject = {
        "name": name,
        "id": nic_id,
        "etag": 'W/"00000000-0000-0000-0000-000000000001"',
        "type": "Microsoft.Network/networkInterfaces",
        "location": "westeurope",
        "properties": {
            "provisioningState": "Succeeded",
            "resourceGuid": "3c7f41b5-8d2e-4f5a-9d4a-2b8f1a6c0e11",
            "ipConfigurations": [
                {
                    "name": "ipconfig1",
                    "id": f"{nic_id}/ipConfigurations/ipconfig1",
                    "etag": 'W/"00000000-0000-0000-0000-000000000001"',
                    "type": "Microsoft.Network/networkInterfaces/ipConfigurations",
                    "properties": {
                        "provisioningState": "Succeeded",
                        "privateIPAddress": ip,
                        "privateIPAllocationMethod": "Dynamic",
                        "subnet": {"id": SUBNET},
                        "primary": True,
                        "privateIPAddressVersion": "IPv4",
                        "loadBalancerBackendAddressPools": [{"id": pool} for pool in pools],
                    },
                }
            ],
            "dnsSettings": {"dnsServers": [], "appliedDnsServers": [], "internalDomainNameSuffix": "x.ax.internal"},
            "macAddress": "00-0D-3A-2B-4C-5D",
            "primary": True,
            "enableAcceleratedNetworking": False,
            "enableIPForwarding": False,
            "nicType": "Standard",
        },
    }
    if vm is not None:
        # ARM keeps the case the VM was created with; group names often differ in case.
        vm_id = f"/subscriptions/{SUB}/resourceGroups/{RG.upper()}/providers/Microsoft.Compute/virtualMachines/{vm}"
        document["properties"]["virtualMachine"] = {"id": vm_id}
    return document


def ip_pool(name: str, entries: list[tuple[str, str]]) -> JsonObject:
    """An IP-based backend pool: (entry name, IP) in the VNet."""
    return {
        "name": name,
        "id": f"{ARM_ID}/loadBalancers/{LB}/backendAddressPools/{name}",
        "etag": 'W/"00000000-0000-0000-0000-000000000001"',
        "type": "Microsoft.Network/loadBalancers/backendAddressPools",
        "properties": {
            "provisioningState": "Succeeded",
            "virtualNetwork": {"id": VNET},
            "loadBalancerBackendAddresses": [
                {"name": entry, "properties": {"ipAddress": ip, "virtualNetwork": {"id": VNET}}}
                for entry, ip in entries
            ],
        },
    }


def nic_pool(name: str, ip_configuration_ids: list[str]) -> JsonObject:
    """A NIC-based backend pool: its members are read-only references to NIC ipConfigurations."""
    return {
        "name": name,
        "id": f"{ARM_ID}/loadBalancers/{LB}/backendAddressPools/{name}",
        "etag": 'W/"00000000-0000-0000-0000-000000000001"',
        "type": "Microsoft.Network/loadBalancers/backendAddressPools",
        "properties": {
            "provisioningState": "Succeeded",
            "backendIPConfigurations": [{"id": ipc} for ipc in ip_configuration_ids],
            "loadBalancerBackendAddresses": [
                {"name": f"member-{n}", "properties": {"networkInterfaceIPConfiguration": {"id": ipc}}}
                for n, ipc in enumerate(ip_configuration_ids)
            ],
        },
    }


# ---------------------------------------------------------------- the ARM stand-in


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Fault:
    """Once, for the next request matching `method` and `path_part`: run `before` (someone else
    acting at that moment), then answer `status`, or handle the request as usual when it is None."""

    method: str
    path_part: str
    status: int | None
    before: Callable[[FakeArm], None] | None = None


@dataclass
class FakeArm:
    resources: dict[str, JsonObject] = field(default_factory=dict)  # lower-case id → document
    requests: list[Request] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    versions: int = 1
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, document: JsonObject) -> None:
        self.resources[document["id"].lower()] = document

    def get(self, resource_id: str) -> JsonObject:
        return self.resources[resource_id.lower()]

    def change(self, resource_id: str, edit: Callable[[JsonObject], None]) -> None:
        """Another actor edits the resource: its etag changes."""
        document = self.get(resource_id)
        edit(document)
        self.versions += 1
        document["etag"] = f'W/"00000000-0000-0000-0000-{self.versions:012d}"'

    def puts(self) -> list[Request]:
        return [request for request in self.requests if request.method == "PUT"]

    def handle(self, method: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, JsonObject]:
        with self.lock:
            self.requests.append(Request(method, path, headers, body))
            for fault in self.faults:
                if fault.method == method and fault.path_part.lower() in path.lower():
                    self.faults.remove(fault)
                    if fault.before is not None:
                        fault.before(self)
                    if fault.status is not None:
                        return fault.status, _error(fault.status)
                    break
            if headers.get("authorization") != f"Bearer {TOKEN}":
                return 401, _error(401)
            key = path.lower()
            if method == "GET" and key in self.resources:
                return 200, self.resources[key]
            if method == "GET":
                members = [doc for rid, doc in self.resources.items() if rid.rsplit("/", 1)[0] == key]
                if members or key.endswith(("/networkinterfaces", "/backendaddresspools")):
                    return 200, {"value": members}
                return 404, _error(404)
            if method == "PUT":
                return self._put(key, headers, body)
            return 405, _error(405)

    def _put(self, key: str, headers: dict[str, str], body: JsonObject) -> tuple[int, JsonObject]:
        current = self.resources.get(key)
        if current is None:
            return 404, _error(404)
        if_match = headers.get("if-match")
        if if_match and if_match != current["etag"]:
            return 412, _error(412)
        stored = copy.deepcopy(body)
        self.versions += 1
        stored.update(
            id=current["id"],
            name=current["name"],
            type=current["type"],
            etag=f'W/"00000000-0000-0000-0000-{self.versions:012d}"',
        )
        properties = stored.setdefault("properties", {})
        # The client leaves read-only properties out of a PUT; ARM keeps them, as here.
        for name in READ_ONLY_PROPERTIES:
            if name in current.get("properties", {}):
                properties[name] = copy.deepcopy(current["properties"][name])
        _keep_nic_references(current, properties)
        properties["provisioningState"] = "Succeeded"
        self.resources[key] = stored
        return 200, stored


READ_ONLY_PROPERTIES = ("virtualMachine", "macAddress", "resourceGuid", "primary", "backendIPConfigurations")


def _keep_nic_references(current: JsonObject, properties: JsonObject) -> None:
    """A NIC-based pool's entry names a NIC ipConfiguration, read-only: the client sends the entry
    without it (by name, with what may change, such as adminState), and ARM keeps it."""
    references = {
        entry.get("name"): entry["properties"]["networkInterfaceIPConfiguration"]
        for entry in current.get("properties", {}).get("loadBalancerBackendAddresses", [])
        if "networkInterfaceIPConfiguration" in entry.get("properties", {})
    }
    for entry in properties.get("loadBalancerBackendAddresses", []):
        if entry.get("name") in references:
            entry.setdefault("properties", {})["networkInterfaceIPConfiguration"] = copy.deepcopy(
                references[entry["name"]]
            )


def _error(status: int) -> JsonObject:
    codes = {
        401: "AuthenticationFailed",
        403: "AuthorizationFailed",
        404: "ResourceNotFound",
        412: "PreconditionFailed",
        429: "TooManyRequests",
        500: "InternalServerError",
    }
    code = codes.get(status, "Error")
    return {"error": {"code": code, "message": f"{code} (from the test's ARM stand-in)"}}


def _handler(arm: FakeArm) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._answer("GET")

        def do_PUT(self) -> None:
            self._answer("PUT")

        def _answer(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers = {key.lower(): value for key, value in self.headers.items()}
            status, document = arm.handle(method, urlsplit(self.path).path, headers, json.loads(raw) if raw else None)
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


def _self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "arm.pem", directory / "arm.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


class StaticToken:
    """A TokenCredential that always hands out the same bearer token."""

    def get_token(
        self,
        *scopes: str,
        claims: str | None = None,
        tenant_id: str | None = None,
        enable_cae: bool = False,
        **kwargs: Any,
    ) -> AccessToken:
        return AccessToken(TOKEN, int(time.time()) + 3600)


@dataclass
class Arm:
    fake: FakeArm
    client: NetworkManagementClient

    def balancer(self, **options: Any) -> AzureLoadBalancer:
        return AzureLoadBalancer(self.client, SUB, RG, LB, nics_in_resource_group(self.client, RG), **options)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _self_signed(tmp_path_factory.mktemp("arm-tls"))


@pytest.fixture
def arm(certificate: tuple[Path, Path]) -> Iterator[Arm]:
    cert_path, key_path = certificate
    fake = FakeArm()
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _handler(fake))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    client = NetworkManagementClient(
        StaticToken(),
        SUB,
        base_url=f"https://127.0.0.1:{server.server_address[1]}",
        connection_verify=str(cert_path),
        retry_total=0,  # one answer per request: the adapter's mapping is under test, not the SDK's retries
        polling_interval=0,
    )
    try:
        yield Arm(fake, client)
    finally:
        client.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _pools_of(document: JsonObject) -> list[str]:
    configuration = document["properties"]["ipConfigurations"][0]["properties"]
    return [pool["id"] for pool in configuration.get("loadBalancerBackendAddressPools", [])]


def _addresses_of(document: JsonObject) -> list[tuple[str, str]]:
    return [
        (entry["name"], entry["properties"]["ipAddress"])
        for entry in document["properties"].get("loadBalancerBackendAddresses", [])
    ]


def _through_the_store(memento: JsonObject | None) -> JsonObject:
    """What the state store gives back: the memento as JSON."""
    assert memento is not None
    loaded: JsonObject = json.loads(json.dumps(memento))
    return loaded


def drain(balancer: AzureLoadBalancer, vm: str) -> JsonObject | None:
    """A drain as the core makes it: locate, record the memento (here: as JSON), then remove."""
    memento = balancer.locate(vm)
    if memento is not None:
        balancer.remove(vm, _through_the_store(memento))
    return memento


def _put_names(fake: FakeArm) -> list[str]:
    return [put.path.rsplit("/", 1)[1] for put in fake.puts()]


# ---------------------------------------------------------------- locate


def test_locate_only_reads_and_names_every_pool_the_vm_is_in(arm: Arm) -> None:
    # GIVEN web-0 in the NIC-based pool-http (and another LB's pool) and, by its IP, in pool-ip
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP, OTHER_LB_POOL]))
    arm.fake.add(ip_pool("pool-ip", THREE_ENTRIES))
    before = copy.deepcopy(arm.fake.resources)

    # WHEN web-0 is located
    memento = arm.balancer().locate("web-0")

    # THEN only GETs reached ARM, nothing changed, and the memento names both memberships
    assert arm.fake.requests
    assert {request.method for request in arm.fake.requests} == {"GET"}
    assert arm.fake.resources == before
    assert memento == WEB_0_IN_BOTH


def test_locate_finds_nothing_for_a_vm_in_no_pool_of_the_load_balancer(arm: Arm) -> None:
    # GIVEN web-0 only in another LB's pool, and an IP-based pool without its IP; a NIC with no VM
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [OTHER_LB_POOL]))
    arm.fake.add(nic("spare-nic", None, "10.0.1.7", [POOL_HTTP]))
    arm.fake.add(ip_pool("pool-ip", [("web-1-addr", "10.0.1.5")]))

    # WHEN web-0 and a VM without a NIC are located
    # THEN there is nothing to remove or restore, and nothing was written
    assert arm.balancer().locate("web-0") is None
    assert arm.balancer().locate("web-9") is None
    assert arm.fake.puts() == []


def test_locate_without_a_nic_is_none_and_asks_arm_nothing(arm: Arm) -> None:
    # GIVEN a NIC lookup that finds no NIC (a VMSS Uniform instance, say)
    balancer = AzureLoadBalancer(arm.client, SUB, RG, LB, lambda vm: [])

    # WHEN the VM is located
    # THEN it is in no pool, and no request was made
    assert balancer.locate("web-0") is None
    assert arm.fake.requests == []


# ---------------------------------------------------------------- NIC-based pools


def test_drain_removes_the_nic_from_this_load_balancers_pools_only(arm: Arm) -> None:
    # GIVEN web-0's NIC in pool-http of our LB and in a pool of another LB
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP, OTHER_LB_POOL]))
    arm.fake.add(nic_pool("pool-http", [f"{WEB_0_NIC}/ipConfigurations/ipconfig1"]))

    # WHEN web-0 is drained
    memento = drain(arm.balancer(), "web-0")

    # THEN one PUT of the NIC, If-Match its etag, keeps only the other LB's pool
    (put,) = arm.fake.puts()
    assert put.path.endswith("/networkInterfaces/web-0-nic")
    assert put.headers["if-match"] == 'W/"00000000-0000-0000-0000-000000000001"'
    assert _pools_of(put.body) == [OTHER_LB_POOL]
    assert put.headers["authorization"] == f"Bearer {TOKEN}"
    # ... and the memento says exactly what was removed
    assert memento == {"nic": [{"nic_id": WEB_0_NIC, "ip_configuration": "ipconfig1", "pools": [POOL_HTTP]}]}


def test_restore_puts_the_nic_back_into_exactly_the_pools_it_left(arm: Arm) -> None:
    # GIVEN web-0 drained from pool-http
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP, OTHER_LB_POOL]))
    balancer = arm.balancer()
    memento = _through_the_store(drain(balancer, "web-0"))

    # WHEN it is restored
    balancer.restore("web-0", memento)

    # THEN the second PUT references pool-http again, and nothing else changed
    restore_put = arm.fake.puts()[-1]
    assert sorted(_pools_of(restore_put.body)) == sorted([POOL_HTTP, OTHER_LB_POOL])
    assert restore_put.body["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"] == "10.0.1.4"
    assert sorted(_pools_of(arm.fake.get(WEB_0_NIC))) == sorted([POOL_HTTP, OTHER_LB_POOL])


def test_the_vm_is_matched_by_name_case_insensitively_and_never_by_suffix(arm: Arm) -> None:
    # GIVEN NICs of WEB-0 (upper case in ARM) and of myweb-0, both in pool-http
    arm.fake.add(nic("web-0-nic", "WEB-0", "10.0.1.4", [POOL_HTTP]))
    arm.fake.add(nic("myweb-0-nic", "myweb-0", "10.0.1.9", [POOL_HTTP]))

    # WHEN web-0 is drained
    drain(arm.balancer(), "web-0")

    # THEN only WEB-0's NIC is written
    assert _put_names(arm.fake) == ["web-0-nic"]
    assert _pools_of(arm.fake.get(f"{ARM_ID}/networkInterfaces/myweb-0-nic")) == [POOL_HTTP]


def test_with_the_scopes_directory_the_nic_is_the_verified_vms_by_full_resource_id(arm: Arm) -> None:
    # GIVEN production's web-0 (in RG) and a sandbox VM named web-0 in another group, whose NIC was
    # put in the NIC group too, both in pool-http
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP]))
    sandbox = nic("sandbox-web-0-nic", None, "10.0.1.7", [POOL_HTTP])
    sandbox_id = f"/subscriptions/{SUB}/resourceGroups/rg-sandbox/providers/Microsoft.Compute/virtualMachines/web-0"
    sandbox["properties"]["virtualMachine"] = {"id": sandbox_id}
    arm.fake.add(sandbox)
    # AND the deployment's scope, which knows web-0 as production's VM only
    directory = StaticVmDirectory({SUB: {"3f2a8c1e-5b7d-4e9a-a1c3-0d4e5f6a7b80": "web-0"}}, group=RG.upper())
    balancer = AzureLoadBalancer(arm.client, SUB, RG, LB, nics_of_scoped_vm(arm.client, RG, directory))

    # WHEN web-0 is drained
    drain(balancer, "web-0")

    # THEN only production's NIC is written: a name suffix never stands for the VM
    assert _put_names(arm.fake) == ["web-0-nic"]
    assert _pools_of(arm.fake.get(f"{ARM_ID}/networkInterfaces/sandbox-web-0-nic")) == [POOL_HTTP]


def test_with_the_vms_nic_ids_a_drain_reads_its_nics_and_never_lists_the_group(arm: Arm) -> None:
    # GIVEN a group of many NICs, and a directory that read web-0's network profile
    for index in range(1, 30):
        arm.fake.add(nic(f"other-{index}-nic", f"other-{index}", f"10.0.2.{index}", [POOL_HTTP]))
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP]))
    vm_id = "3f2a8c1e-5b7d-4e9a-a1c3-0d4e5f6a7b80"
    directory = StaticVmDirectory(
        {SUB: {vm_id: "web-0"}}, group=RG.upper(), nic_ids={vm_id: [f"{ARM_ID}/networkInterfaces/web-0-nic"]}
    )
    balancer = AzureLoadBalancer(arm.client, SUB, RG, LB, nics_of_scoped_vm(arm.client, RG, directory))

    # WHEN web-0 is drained
    drain(balancer, "web-0")

    # THEN its NIC was read by id and written; the group's NICs were never listed (a wave would list
    # them once per drain)
    assert _put_names(arm.fake) == ["web-0-nic"]
    nic_reads = [r.path for r in arm.fake.requests if r.method == "GET" and "/networkinterfaces" in r.path.lower()]
    assert nic_reads
    assert all(path.lower().endswith("/networkinterfaces/web-0-nic") for path in nic_reads)


def test_a_nic_moved_to_another_vm_since_the_directory_was_read_is_not_touched(arm: Arm) -> None:
    # GIVEN a directory that saw web-0-nic on web-0, and the NIC now attached to web-9
    arm.fake.add(nic("web-0-nic", "web-9", "10.0.1.4", [POOL_HTTP]))
    vm_id = "3f2a8c1e-5b7d-4e9a-a1c3-0d4e5f6a7b80"
    directory = StaticVmDirectory(
        {SUB: {vm_id: "web-0"}},
        group=RG.upper(),
        nic_ids={vm_id: [f"{ARM_ID}/networkInterfaces/web-0-nic", f"{ARM_ID}/networkInterfaces/deleted-nic"]},
    )
    balancer = AzureLoadBalancer(arm.client, SUB, RG, LB, nics_of_scoped_vm(arm.client, RG, directory))

    # WHEN web-0 is drained THEN nothing is found to drain and nothing is written
    assert balancer.locate("web-0") is None
    assert arm.fake.puts() == []


def test_a_name_the_scope_holds_twice_is_refused_before_anything_is_read(arm: Arm) -> None:
    other = "0b7e4a31-1111-4000-8000-0000000000aa"
    twins = StaticVmDirectory(
        {
            SUB: {"3f2a8c1e-5b7d-4e9a-a1c3-0d4e5f6a7b80": "web-0"},
            other: {"9d0f5c3e-7b1a-4e62-8f0d-000000000001": "web-0"},
        }
    )
    balancer = AzureLoadBalancer(arm.client, SUB, RG, LB, nics_of_scoped_vm(arm.client, RG, twins))
    with pytest.raises(PermanentError, match="2 VMs of the deployment's scope are named 'web-0'"):
        balancer.locate("web-0")
    assert arm.fake.requests == []


def test_restore_of_a_deleted_vms_nic_is_a_no_op(arm: Arm) -> None:
    # GIVEN a memento of a NIC that no longer exists (a Terminate event deleted the VM)
    memento = {
        "nic": [
            {"nic_id": f"{ARM_ID}/networkInterfaces/gone-nic", "ip_configuration": "ipconfig1", "pools": [POOL_HTTP]}
        ]
    }

    # WHEN it is restored
    arm.balancer().restore("gone", memento)

    # THEN nothing is written and nothing fails
    assert arm.fake.puts() == []


def test_remove_skips_a_nic_that_is_gone_and_goes_on(arm: Arm) -> None:
    # GIVEN a memento naming a NIC deleted since it was located, and web-0's NIC
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP]))
    gone = {"nic_id": f"{ARM_ID}/networkInterfaces/gone-nic", "ip_configuration": "ipconfig1", "pools": [POOL_HTTP]}
    memento = {"nic": [gone, *WEB_0_IN_BOTH["nic"]]}

    # WHEN web-0 is removed
    arm.balancer().remove("web-0", memento)

    # THEN the gone NIC is skipped and web-0's NIC leaves pool-http
    assert _put_names(arm.fake) == ["web-0-nic"]
    assert _pools_of(arm.fake.get(WEB_0_NIC)) == []


def test_a_nic_changed_between_read_and_write_is_read_again(arm: Arm) -> None:
    # GIVEN web-0's NIC, which someone else changes right before our first write lands
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP, OTHER_LB_POOL]))

    def other_writer(fake: FakeArm) -> None:
        fake.change(WEB_0_NIC, lambda doc: doc["properties"].update(enableIPForwarding=True))

    arm.fake.faults.append(Fault("PUT", "/networkInterfaces/web-0-nic", None, before=other_writer))

    # WHEN web-0 is drained
    drain(arm.balancer(), "web-0")

    # THEN the second write starts from the other change and keeps it
    stored = arm.fake.get(WEB_0_NIC)
    assert stored["properties"]["enableIPForwarding"] is True
    assert _pools_of(stored) == [OTHER_LB_POOL]


# ---------------------------------------------------------------- IP-based pools


def test_drain_removes_the_vms_ip_from_an_ip_based_pool(arm: Arm) -> None:
    # GIVEN web-1 (10.0.1.5) in the IP-based pool with two other VMs, and a NIC-based pool
    arm.fake.add(nic("web-1-nic", "web-1", "10.0.1.5", []))
    arm.fake.add(ip_pool("pool-ip", THREE_ENTRIES))
    arm.fake.add(nic_pool("pool-http", [f"{WEB_0_NIC}/ipConfigurations/ipconfig1"]))

    # WHEN web-1 is drained
    memento = drain(arm.balancer(), "web-1")

    # THEN one PUT of the pool, If-Match its etag, without web-1's entry
    (put,) = arm.fake.puts()
    assert put.path.endswith("/backendAddressPools/pool-ip")
    assert put.headers["if-match"] == 'W/"00000000-0000-0000-0000-000000000001"'
    assert _addresses_of(put.body) == [("web-0-addr", "10.0.1.4"), ("web-2-addr", "10.0.1.6")]
    # ... and the memento holds the pool and the entry as it was
    assert memento == {
        "ip": [
            {
                "pool_id": POOL_IP,
                "address": {"name": "web-1-addr", "ip_address": "10.0.1.5", "virtual_network_id": VNET},
            }
        ]
    }


def test_restore_re_adds_exactly_the_removed_entry(arm: Arm) -> None:
    # GIVEN web-1 drained from the IP-based pool
    arm.fake.add(nic("web-1-nic", "web-1", "10.0.1.5", []))
    arm.fake.add(ip_pool("pool-ip", [("web-0-addr", "10.0.1.4"), ("web-1-addr", "10.0.1.5")]))
    balancer = arm.balancer()
    memento = _through_the_store(drain(balancer, "web-1"))

    # WHEN it is restored
    balancer.restore("web-1", memento)

    # THEN the pool holds the entry again, with its name and network
    restore_put = arm.fake.puts()[-1]
    assert _addresses_of(restore_put.body) == [("web-0-addr", "10.0.1.4"), ("web-1-addr", "10.0.1.5")]
    entry = restore_put.body["properties"]["loadBalancerBackendAddresses"][1]
    assert entry == {"name": "web-1-addr", "properties": {"ipAddress": "10.0.1.5", "virtualNetwork": {"id": VNET}}}


def test_an_ip_the_vm_no_longer_holds_is_not_put_back(arm: Arm) -> None:
    # GIVEN web-1 drained, then deleted (its NIC is gone; the IP may go to another VM)
    arm.fake.add(nic("web-1-nic", "web-1", "10.0.1.5", []))
    arm.fake.add(ip_pool("pool-ip", [("web-1-addr", "10.0.1.5")]))
    balancer = arm.balancer()
    memento = _through_the_store(drain(balancer, "web-1"))
    del arm.fake.resources[f"{ARM_ID}/networkInterfaces/web-1-nic".lower()]

    # WHEN it is restored
    balancer.restore("web-1", memento)

    # THEN the pool stays without it
    assert len(arm.fake.puts()) == 1
    assert _addresses_of(arm.fake.get(POOL_IP)) == []


def test_remove_leaves_an_ip_that_now_belongs_to_another_vm(arm: Arm) -> None:
    # GIVEN web-1 located in pool-ip, then deleted before the removal, and its IP given to web-7
    arm.fake.add(nic("web-1-nic", "web-1", "10.0.1.5", []))
    arm.fake.add(ip_pool("pool-ip", THREE_ENTRIES))
    balancer = arm.balancer()
    memento = _through_the_store(balancer.locate("web-1"))
    del arm.fake.resources[f"{ARM_ID}/networkInterfaces/web-1-nic".lower()]
    arm.fake.add(nic("web-7-nic", "web-7", "10.0.1.5", []))

    # WHEN the removal runs (a retry, say)
    balancer.remove("web-1", memento)

    # THEN web-7 keeps its traffic
    assert arm.fake.puts() == []
    assert _addresses_of(arm.fake.get(POOL_IP)) == THREE_ENTRIES


def test_a_concurrent_drain_from_the_same_pool_is_not_undone(arm: Arm) -> None:
    # GIVEN web-1 and web-2 in the IP-based pool; another invocation drains web-2 just before our write
    arm.fake.add(nic("web-1-nic", "web-1", "10.0.1.5", []))
    arm.fake.add(ip_pool("pool-ip", THREE_ENTRIES))

    def other_drain(fake: FakeArm) -> None:
        def drop_web_2(doc: JsonObject) -> None:
            addresses = doc["properties"]["loadBalancerBackendAddresses"]
            doc["properties"]["loadBalancerBackendAddresses"] = [a for a in addresses if a["name"] != "web-2-addr"]

        fake.change(POOL_IP, drop_web_2)

    arm.fake.faults.append(Fault("PUT", "/backendAddressPools/pool-ip", None, before=other_drain))

    # WHEN web-1 is drained
    memento = drain(arm.balancer(), "web-1")

    # THEN our first write was refused (412), and the one made on a fresh read keeps the other drain
    assert [put.headers["if-match"] for put in arm.fake.puts()] == [
        'W/"00000000-0000-0000-0000-000000000001"',
        'W/"00000000-0000-0000-0000-000000000002"',
    ]
    assert _addresses_of(arm.fake.get(POOL_IP)) == [("web-0-addr", "10.0.1.4")]
    assert [a["address"]["name"] for a in (memento or {})["ip"]] == ["web-1-addr"]


# ---------------------------------------------------------------- both kinds, retries


def test_a_vm_in_both_kinds_of_pool_leaves_both_and_comes_back_to_both(arm: Arm) -> None:
    # GIVEN web-0 in the NIC-based pool-http and, by its IP, in the IP-based pool-ip
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP]))
    arm.fake.add(ip_pool("pool-ip", THREE_ENTRIES))
    balancer = arm.balancer()

    # WHEN it is drained
    memento = _through_the_store(drain(balancer, "web-0"))

    # THEN the memento has both parts, and the VM is out of both pools
    assert memento == WEB_0_IN_BOTH
    assert _pools_of(arm.fake.get(WEB_0_NIC)) == []
    assert "web-0-addr" not in dict(_addresses_of(arm.fake.get(POOL_IP)))

    # ... and restore brings it back to both
    balancer.restore("web-0", memento)
    assert _pools_of(arm.fake.get(WEB_0_NIC)) == [POOL_HTTP]
    assert sorted(_addresses_of(arm.fake.get(POOL_IP))) == THREE_ENTRIES


def test_remove_twice_with_the_same_memento_writes_once(arm: Arm) -> None:
    # GIVEN web-0 in both kinds of pool, removed once
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP]))
    arm.fake.add(ip_pool("pool-ip", THREE_ENTRIES))
    balancer = arm.balancer()
    memento = _through_the_store(balancer.locate("web-0"))
    balancer.remove("web-0", memento)
    assert _put_names(arm.fake) == ["web-0-nic", "pool-ip"]
    after_first = copy.deepcopy(arm.fake.resources)

    # WHEN the same removal runs again (a redelivery)
    balancer.remove("web-0", memento)

    # THEN it finds the VM out of everything: no PUT, no change
    assert _put_names(arm.fake) == ["web-0-nic", "pool-ip"]
    assert arm.fake.resources == after_first


def _storm(status: int, times: int) -> list[Fault]:
    return [Fault("PUT", "/backendAddressPools/pool-ip", status) for _ in range(times)]


@pytest.mark.parametrize(
    ("faults", "message"),
    [
        (_storm(503, 1), r"cannot drain backend pool .*pool-ip now \(HTTP 503\)"),
        (_storm(412, WRITE_ATTEMPTS), f"pool-ip kept changing during {WRITE_ATTEMPTS} attempts"),
    ],
    ids=["unavailable", "412-storm"],
)
def test_a_remove_that_fails_part_way_is_finished_by_the_next_and_restored_in_full(
    arm: Arm, faults: list[Fault], message: str
) -> None:
    # GIVEN web-0 in both kinds of pool, located and recorded; ARM failing the writes of pool-ip
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP]))
    arm.fake.add(ip_pool("pool-ip", THREE_ENTRIES))
    balancer = arm.balancer()
    memento = _through_the_store(balancer.locate("web-0"))
    arm.fake.faults.extend(faults)

    # WHEN it is removed
    # THEN the invocation fails for a redelivery, with the VM out of pool-http but still in pool-ip
    with pytest.raises(LoadBalancerUnavailableError, match=message):
        balancer.remove("web-0", memento)
    assert _pools_of(arm.fake.get(WEB_0_NIC)) == []
    assert _addresses_of(arm.fake.get(POOL_IP)) == THREE_ENTRIES
    assert _put_names(arm.fake) == ["web-0-nic"] + ["pool-ip"] * len(faults)

    # WHEN the redelivery removes it with the same memento
    written = len(arm.fake.puts())
    balancer.remove("web-0", memento)

    # THEN it writes only pool-ip, without web-0's entry
    (put,) = arm.fake.puts()[written:]
    assert put.path.endswith("/backendAddressPools/pool-ip")
    assert _addresses_of(put.body) == [("web-1-addr", "10.0.1.5"), ("web-2-addr", "10.0.1.6")]

    # WHEN it is restored
    written = len(arm.fake.puts())
    balancer.restore("web-0", memento)

    # THEN the NIC is back in pool-http and pool-ip holds web-0's entry again, as it was
    nic_put, pool_put = arm.fake.puts()[written:]
    assert nic_put.path.endswith("/networkInterfaces/web-0-nic")
    assert _pools_of(nic_put.body) == [POOL_HTTP]
    assert pool_put.path.endswith("/backendAddressPools/pool-ip")
    assert sorted(_addresses_of(pool_put.body)) == THREE_ENTRIES
    assert pool_put.body["properties"]["loadBalancerBackendAddresses"][-1] == {
        "name": "web-0-addr",
        "properties": {"ipAddress": "10.0.1.4", "virtualNetwork": {"id": VNET}},
    }


def test_restore_after_a_partial_remove_writes_only_what_is_out(arm: Arm) -> None:
    # GIVEN web-0 out of pool-http but still in pool-ip: its removal failed part way
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP]))
    arm.fake.add(ip_pool("pool-ip", THREE_ENTRIES))
    balancer = arm.balancer()
    memento = _through_the_store(balancer.locate("web-0"))
    arm.fake.faults.extend(_storm(500, 1))
    with pytest.raises(LoadBalancerUnavailableError, match="HTTP 500"):
        balancer.remove("web-0", memento)
    written = len(arm.fake.puts())

    # WHEN it is restored with the memento (the event is given up, say)
    balancer.restore("web-0", memento)

    # THEN only the NIC is written; pool-ip keeps its entries as they are
    (put,) = arm.fake.puts()[written:]
    assert put.path.endswith("/networkInterfaces/web-0-nic")
    assert _pools_of(put.body) == [POOL_HTTP]
    assert _addresses_of(arm.fake.get(POOL_IP)) == THREE_ENTRIES


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("status", "error", "message"),
    [
        (403, LoadBalancerConfigError, "not authorised to read the NICs of VM 'web-0': grant"),
        (404, LoadBalancerConfigError, "not found; check MBRIDGE_LB_SUBSCRIPTION_ID"),
        (429, LoadBalancerUnavailableError, r"now \(HTTP 429\)"),
        (500, LoadBalancerUnavailableError, r"now \(HTTP 500\)"),
    ],
)
def test_arm_errors_map_to_retryable_or_permanent(arm: Arm, status: int, error: type[Exception], message: str) -> None:
    # GIVEN ARM answering the NIC list with an error
    arm.fake.faults.append(Fault("GET", "/networkInterfaces", status))

    # WHEN a VM is located
    # THEN the error says whether a redelivery can help, and what to do
    with pytest.raises(error, match=message):
        arm.balancer().locate("web-0")


def test_a_refused_write_on_remove_is_permanent_and_names_the_role(arm: Arm) -> None:
    # GIVEN web-0 located, and ARM refusing the identity the write of its NIC
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP]))
    balancer = arm.balancer()
    memento = _through_the_store(balancer.locate("web-0"))
    arm.fake.faults.append(Fault("PUT", "/networkInterfaces/web-0-nic", 403))

    # WHEN it is removed
    # THEN the error names the NIC and the role to grant
    with pytest.raises(LoadBalancerConfigError, match=r"not authorised to drain NIC .*web-0-nic: grant .* custom role"):
        balancer.remove("web-0", memento)


def test_a_failed_write_on_restore_is_retryable(arm: Arm) -> None:
    # GIVEN web-0 drained, and ARM failing the restoring PUT
    arm.fake.add(nic("web-0-nic", "web-0", "10.0.1.4", [POOL_HTTP]))
    balancer = arm.balancer()
    memento = _through_the_store(drain(balancer, "web-0"))
    arm.fake.faults.append(Fault("PUT", "/networkInterfaces/web-0-nic", 503))

    # WHEN it is restored
    # THEN the invocation fails for a redelivery
    with pytest.raises(LoadBalancerUnavailableError, match=r"NIC .*web-0-nic"):
        balancer.restore("web-0", memento)


def test_an_unreachable_arm_is_retryable(certificate: tuple[Path, Path]) -> None:
    # GIVEN a client pointed at a port nobody listens on
    client = NetworkManagementClient(
        StaticToken(),
        SUB,
        base_url=f"https://127.0.0.1:{free_port()}",
        connection_verify=str(certificate[0]),
        retry_total=0,
    )
    balancer = AzureLoadBalancer(client, SUB, RG, LB, nics_in_resource_group(client, RG))

    # WHEN a VM is located
    # THEN it is retried later
    with pytest.raises(LoadBalancerUnavailableError, match="cannot reach Azure Resource Manager"):
        balancer.locate("web-0")
