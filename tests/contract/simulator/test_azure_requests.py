"""Azure IMDS request rules: the Metadata header, proxies, api-version, and what each version shows."""

from __future__ import annotations

import pytest

from simulator import Simulator
from tests.contract.simulator.conftest import METADATA, StartSim, VmClient, clients

ALL_VERSIONS = ["2017-03-01", "2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01", "2020-07-01"]


@pytest.fixture
def every_type(start_sim: StartSim) -> VmClient:
    """GIVEN one Scheduled event of every type on VM "vm-0"."""
    vm = clients(start_sim(cloud="azure"))[0]
    for event_type in ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"):
        vm.add_event(event_type=event_type, event_id=f"ID-{event_type.upper()}", duration_seconds=7)
    return vm


def test_get_without_metadata_header_is_400(azure: VmClient) -> None:
    # WHEN the Metadata header is missing
    response = azure.get_events(headers={})
    # THEN IMDS answers 400 with a JSON error
    assert response.status_code == 400
    assert "metadata header" in response.json()["error"].lower()


@pytest.mark.parametrize("value", ["false", "yes", ""])
def test_metadata_header_must_be_true(azure: VmClient, value: str) -> None:
    # WHEN the header is present but not "true"
    response = azure.get_events(headers={"Metadata": value})
    # THEN the request is refused like a missing header
    assert response.status_code == 400


def test_header_is_not_enforced_by_the_2017_03_01_preview(azure: VmClient) -> None:
    # WHEN a client uses the preview version without the header
    response = azure.get_events(version="2017-03-01", headers={})
    # THEN it is served, as before "Metadata header requirement enforced for all requests" (2017-08-01)
    assert response.status_code == 200
    assert response.json() == {"DocumentIncarnation": 1, "Events": []}


def test_proxied_requests_are_refused(azure: VmClient) -> None:
    # WHEN a request carries X-Forwarded-For (it went through a proxy)
    response = azure.get_events(headers={**METADATA, "X-Forwarded-For": "10.0.0.4"})
    # THEN IMDS refuses it
    assert response.status_code == 400
    assert "X-Forwarded-For" in response.json()["error"]


@pytest.mark.parametrize("version", [None, "", "latest", "2018-01-01", "2021-02-01"])
def test_missing_or_unknown_api_version_is_400_with_newest_versions(azure: VmClient, version: str | None) -> None:
    # WHEN the api-version is absent or not a Scheduled Events version
    response = azure.get_events(version=version)
    # THEN the documented 400 names the newest versions
    assert response.status_code == 400
    body = response.json()
    assert body["error"].startswith("Bad request. api-version is invalid or was not specified in the request.")
    assert body["newest-versions"] == ["2020-07-01", "2019-08-01", "2019-04-01"]


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_every_documented_version_is_served(azure: VmClient, version: str) -> None:
    # WHEN a client asks with any version of the version table
    response = azure.get_events(version=version)
    # THEN it gets the empty document as JSON
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json() == {"DocumentIncarnation": 1, "Events": []}


@pytest.mark.parametrize(
    ("version", "types", "fields"),
    [
        ("2017-08-01", {"Freeze", "Reboot", "Redeploy"}, []),
        ("2017-11-01", {"Freeze", "Reboot", "Redeploy", "Preempt"}, []),
        ("2019-01-01", {"Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"}, []),
        ("2019-04-01", {"Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"}, ["Description"]),
        ("2019-08-01", {"Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"}, ["Description", "EventSource"]),
        (
            "2020-07-01",
            {"Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"},
            ["Description", "EventSource", "DurationInSeconds"],
        ),
    ],
)
def test_each_version_shows_its_event_types_and_fields(
    every_type: VmClient, version: str, types: set[str], fields: list[str]
) -> None:
    # WHEN the document is read with an older or newer api-version
    events = every_type.events(version)["Events"]
    # THEN only the event types that version knew appear ...
    assert {e["EventType"] for e in events} == types
    # ... each with the base fields, in the documented order, plus the fields added up to that version
    base = ["EventId", "EventStatus", "EventType", "ResourceType", "Resources", "NotBefore"]
    for event in events:
        assert list(event) == base + fields
        assert event["ResourceType"] == "VirtualMachine"
        assert event["Resources"] == ["vm-0"]


def test_preview_version_prefixes_resource_names_with_underscore(every_type: VmClient) -> None:
    # WHEN the 2017-03-01 preview is asked ("removed prepended underscore" came in 2017-08-01)
    events = every_type.events("2017-03-01")["Events"]
    # THEN resource names carry the underscore, and Preempt/Terminate are not shown yet
    assert {e["EventType"] for e in events} == {"Freeze", "Reboot", "Redeploy"}
    assert all(e["Resources"] == ["_vm-0"] for e in events)


def test_newest_version_document_matches_the_documented_shape(every_type: VmClient) -> None:
    # WHEN the 2020-07-01 document is read
    document = every_type.events("2020-07-01")
    # THEN its keys and value types are those of the docs' example
    assert list(document) == ["DocumentIncarnation", "Events"]
    freeze = next(e for e in document["Events"] if e["EventType"] == "Freeze")
    assert freeze["EventId"] == "ID-FREEZE"
    assert freeze["EventStatus"] == "Scheduled"
    assert freeze["NotBefore"].endswith(" GMT")
    assert freeze["EventSource"] == "Platform"
    assert freeze["DurationInSeconds"] == 7


def test_unknown_metadata_path_is_404(azure: VmClient) -> None:
    # WHEN a path IMDS does not have is asked
    import requests

    response = requests.get(
        f"{azure.base_url}/metadata/nothing-here", params={"api-version": "2020-07-01"}, headers=METADATA, timeout=5
    )
    # THEN 404
    assert response.status_code == 404


def test_simulator_refuses_unusable_construction_arguments() -> None:
    # WHEN a simulator is built with a bad speed, cloud or duplicate names
    # THEN it says what is wrong before binding anything
    with pytest.raises(ValueError, match="speed"):
        Simulator(speed=0)
    with pytest.raises(ValueError, match="cloud"):
        Simulator(cloud="aws")
    with pytest.raises(ValueError, match="unique"):
        Simulator(vm_names=["a", "a"])
    with pytest.raises(ValueError, match="not usable"):
        Simulator(vm_names=["has space"])
