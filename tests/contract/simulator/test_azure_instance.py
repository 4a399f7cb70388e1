"""Azure instance metadata: the VM's own name (what Resources lists) and a minimal instance document."""

from __future__ import annotations

import uuid

import pytest
import requests

from tests.contract.simulator.conftest import METADATA, StartSim, VmClient, clients


def get(vm: VmClient, path: str, params: dict[str, str], headers: dict[str, str] | None = None) -> requests.Response:
    return requests.get(
        f"{vm.base_url}/metadata/{path}", params=params, headers=METADATA if headers is None else headers, timeout=5
    )


def test_compute_name_as_text_and_as_json(start_sim: StartSim) -> None:
    # GIVEN two VMs
    vms = clients(start_sim(cloud="azure", vm_names=["WestNO_0", "WestNO_1"]))
    assert len(vms) == 2
    for vm, name in zip(vms, ["WestNO_0", "WestNO_1"]):
        # WHEN each asks for its name with format=text, and without
        text = get(vm, "instance/compute/name", {"api-version": "2021-02-01", "format": "text"})
        as_json = get(vm, "instance/compute/name", {"api-version": "2021-02-01"})
        # THEN text is the bare name, JSON a JSON string
        assert text.status_code == 200
        assert text.headers["Content-Type"].startswith("text/plain")
        assert text.text == name
        assert as_json.status_code == 200
        assert as_json.json() == name


def test_instance_document_identifies_the_vm(azure: VmClient) -> None:
    # WHEN the instance document is read
    response = get(azure, "instance", {"api-version": "2021-12-13"})
    # THEN it has the compute keys a client needs, vmId stable and a UUID
    assert response.status_code == 200
    document = response.json()
    compute = document["compute"]
    assert list(compute) == [
        "name",
        "vmId",
        "location",
        "resourceGroupName",
        "subscriptionId",
        "vmScaleSetName",
        "azEnvironment",
    ]
    assert compute["name"] == "vm-0"
    assert compute["azEnvironment"] == "AzurePublicCloud"
    assert str(uuid.UUID(compute["vmId"])) == compute["vmId"]
    assert document["network"] == {"interface": []}
    again = get(azure, "instance", {"api-version": "2023-07-01"}).json()
    assert again["compute"]["vmId"] == compute["vmId"]


@pytest.mark.parametrize(
    "version", ["2017-08-01", "2019-06-01", "2020-09-01", "2021-02-01", "2021-12-13", "2023-07-01"]
)
def test_documented_instance_versions_are_accepted(azure: VmClient, version: str) -> None:
    # WHEN a documented IMDS version is used
    response = get(azure, "instance/compute/name", {"api-version": version, "format": "text"})
    # THEN it is served
    assert response.status_code == 200
    assert response.text == "vm-0"


def test_instance_endpoint_refuses_like_imds(azure: VmClient) -> None:
    # WHEN the header is missing, the version unknown, or format=text asked for a non-leaf
    no_header = get(azure, "instance/compute/name", {"api-version": "2021-02-01"}, headers={})
    bad_version = get(azure, "instance/compute/name", {"api-version": "2020-07-01"})
    non_leaf = get(azure, "instance/compute", {"api-version": "2021-02-01", "format": "text"})
    missing = get(azure, "instance/compute/nothing", {"api-version": "2021-02-01"})
    # THEN 400, 400 (with the newest versions), 400 and 404
    assert no_header.status_code == 400
    assert bad_version.status_code == 400
    assert "newest-versions" in bad_version.json()
    assert non_leaf.status_code == 400
    assert missing.status_code == 404
