"""GCE metadata over real HTTP: keys, headers, ETags, wait_for_change, and the skipped 60-second warning."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Callable

import pytest
import requests

from tests.contract.simulator.conftest import StartSim, VmClient, clients

ETAG = re.compile(r"[0-9a-f]{16}")


def set_value(vm: VmClient, key: str, value: object, **extra: object) -> dict[str, object]:
    result: dict[str, object] = vm.post_ok("gce", {"key": key, "value": value, **extra})
    return result


def later(seconds: float, action: Callable[[], object]) -> threading.Thread:
    """Run `action` from another thread after `seconds` (a change made while a long-poll waits)."""

    def run() -> None:
        time.sleep(seconds)
        action()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("instance/maintenance-event", "NONE"),
        ("instance/preempted", "FALSE"),
        ("instance/name", "gce-vm-0"),
        ("project/project-id", "maintenance-bridge-sim"),
    ],
)
def test_plain_keys_have_their_default_values(gce: VmClient, path: str, expected: str) -> None:
    # WHEN a plain key is read with the required header
    response = gce.gce(path)
    # THEN the value comes as application/text with Metadata-Flavor and a 16-hex-digit ETag
    assert response.status_code == 200
    assert response.text == expected
    assert response.headers["Content-Type"].startswith("application/text")
    assert response.headers["Metadata-Flavor"] == "Google"
    assert ETAG.fullmatch(response.headers["ETag"])


def test_identity_keys_are_stable_and_well_formed(start_sim: StartSim) -> None:
    # GIVEN two simulators serving the same VM name
    first = clients(start_sim(cloud="gce", vm_names=["node-1"]))[0]
    second = clients(start_sim(cloud="gce", vm_names=["node-1"]))[0]
    # WHEN id and zone are read
    ids = [vm.gce("instance/id").text for vm in (first, second)]
    zone = first.gce("instance/zone").text
    # THEN the id is a stable number and the zone has the documented form
    assert ids[0] == ids[1]
    assert ids[0].isdigit()
    assert re.fullmatch(r"projects/\d+/zones/[a-z0-9-]+", zone)


@pytest.mark.parametrize(
    "headers", [{}, {"Metadata-Flavor": "google"}, {"Metadata-Flavor": "Google", "X-Forwarded-For": "1.2.3.4"}]
)
def test_requests_without_the_flavor_header_or_through_a_proxy_are_403(gce: VmClient, headers: dict[str, str]) -> None:
    # WHEN the header is missing or wrong, or the request was proxied
    response = gce.gce("instance/maintenance-event", headers=headers)
    # THEN 403
    assert response.status_code == 403


def test_absent_upcoming_maintenance_is_404_with_its_own_etag(gce: VmClient) -> None:
    # WHEN upcoming-maintenance is read while none is announced
    response = gce.gce("instance/upcoming-maintenance")
    # THEN 404, still with Metadata-Flavor and an ETag
    assert response.status_code == 404
    assert response.headers["Metadata-Flavor"] == "Google"
    assert ETAG.fullmatch(response.headers["ETag"])
    assert response.headers["ETag"] != gce.gce("instance/maintenance-event").headers["ETag"]


def test_upcoming_maintenance_has_the_documented_fields(gce: VmClient) -> None:
    # WHEN a window is announced one hour ahead
    set_value(gce, "upcoming-maintenance", {"window_start_in": 3600, "canReschedule": True})
    response = gce.gce("instance/upcoming-maintenance")
    # THEN it is JSON with the documented keys; canReschedule is the string "true"
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    value = response.json()
    assert list(value) == [
        "maintenanceType",
        "canReschedule",
        "latestWindowStartTime",
        "maintenanceStatus",
        "windowEndTime",
        "windowStartTime",
    ]
    assert value["canReschedule"] == "true"
    assert value["maintenanceStatus"] == "PENDING"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", value["windowStartTime"])
    assert value["windowEndTime"] > value["windowStartTime"]
    # WHEN its status is patched, then it is removed
    set_value(gce, "upcoming-maintenance", {"maintenanceStatus": "ONGOING"})
    ongoing = gce.gce("instance/upcoming-maintenance").json()
    set_value(gce, "upcoming-maintenance", None)
    # THEN the window is kept while ONGOING, and the key is gone afterwards
    assert ongoing == {**value, "maintenanceStatus": "ONGOING"}
    assert gce.gce("instance/upcoming-maintenance").status_code == 404


def test_alt_json_encodes_plain_values(gce: VmClient) -> None:
    # WHEN a plain key is asked with alt=json
    response = gce.gce("instance/maintenance-event", params={"alt": "json"})
    # THEN the value is a JSON string
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json() == "NONE"


def test_preempted_turns_true_and_stays(gce: VmClient) -> None:
    # WHEN the VM is preempted, kept serving (else it shuts down 30 s later) so it can be read an hour on
    set_value(gce, "preempted", "TRUE", keep_serving=True)
    gce.advance(3600)
    # THEN preempted still reads TRUE
    assert gce.gce("instance/preempted").text == "TRUE"


def test_etag_changes_with_the_value(gce: VmClient) -> None:
    # GIVEN the ETag of NONE
    none_etag = gce.gce("instance/maintenance-event").headers["ETag"]
    # WHEN the value changes and changes back
    set_value(gce, "maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
    migrate_etag = gce.gce("instance/maintenance-event").headers["ETag"]
    set_value(gce, "maintenance-event", "NONE")
    # THEN the ETag follows the value
    assert migrate_etag != none_etag
    assert gce.gce("instance/maintenance-event").headers["ETag"] == none_etag


# --------------------------------------------------------------------------- wait_for_change


def test_long_poll_answers_at_once_when_last_etag_differs(gce: VmClient) -> None:
    # WHEN a client long-polls with an ETag that is not the current one (the docs' sample starts with "0")
    began = time.monotonic()
    response = gce.gce("instance/maintenance-event", params={"wait_for_change": "true", "last_etag": "0"})
    # THEN the current value comes back without waiting for the 60 s default timeout
    assert response.status_code == 200
    assert response.text == "NONE"
    assert time.monotonic() - began < 30


def test_long_poll_blocks_until_the_value_changes(gce: VmClient) -> None:
    # GIVEN the current ETag
    etag = gce.gce("instance/maintenance-event").headers["ETag"]
    # WHEN a long-poll with that ETag is pending and another thread announces a migration 0.5 s later
    changer = later(0.5, lambda: set_value(gce, "maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE"))
    began = time.monotonic()
    response = gce.gce(
        "instance/maintenance-event", params={"wait_for_change": "true", "last_etag": etag, "timeout_sec": "30"}
    )
    waited = time.monotonic() - began
    changer.join()
    # THEN the answer is the new value, after the change and well before the timeout
    assert response.text == "MIGRATE_ON_HOST_MAINTENANCE"
    assert response.headers["ETag"] != etag
    assert 0.4 <= waited < 30


def test_long_poll_without_last_etag_waits_for_the_next_change(gce: VmClient) -> None:
    # WHEN a long-poll without last_etag is pending and the VM gets preempted 0.3 s later
    changer = later(0.3, lambda: set_value(gce, "preempted", True))
    began = time.monotonic()
    response = gce.gce("instance/preempted", params={"wait_for_change": "true", "timeout_sec": "30"})
    changer.join()
    # THEN it returned with the changed value
    assert response.text == "TRUE"
    assert time.monotonic() - began >= 0.25


def test_long_poll_times_out_with_the_current_value(gce: VmClient) -> None:
    # GIVEN the current ETag
    etag = gce.gce("instance/maintenance-event").headers["ETag"]
    # WHEN nothing changes during a 1-second long-poll
    began = time.monotonic()
    response = gce.gce(
        "instance/maintenance-event", params={"wait_for_change": "true", "last_etag": etag, "timeout_sec": "1"}
    )
    # THEN after the timeout the unchanged value and ETag come back
    assert time.monotonic() - began >= 0.95
    assert response.status_code == 200
    assert response.text == "NONE"
    assert response.headers["ETag"] == etag


def test_long_poll_on_an_absent_key_times_out_with_404(gce: VmClient) -> None:
    # WHEN a long-poll on the absent upcoming-maintenance sees no change
    response = gce.gce("instance/upcoming-maintenance", params={"wait_for_change": "true", "timeout_sec": "1"})
    # THEN 404 with the absent key's ETag
    assert response.status_code == 404
    assert ETAG.fullmatch(response.headers["ETag"])


def test_long_poll_rejects_a_bad_timeout(gce: VmClient) -> None:
    # WHEN timeout_sec is not a positive whole number
    response = gce.gce("instance/maintenance-event", params={"wait_for_change": "true", "timeout_sec": "soon"})
    # THEN 400
    assert response.status_code == 400


# --------------------------------------------------------------------------- the 60-second warning rule


def test_warning_is_skipped_when_maintenance_event_was_never_queried(gce: VmClient) -> None:
    # GIVEN a VM that never queried maintenance-event (only its parent directory)
    assert gce.gce("instance/").status_code == 200
    # WHEN a live migration is announced
    result = set_value(gce, "maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
    # THEN the value stays NONE and the simulator logs why
    assert result["shown"] is False
    assert gce.gce("instance/maintenance-event").text == "NONE"
    messages = [entry["message"] for entry in gce.get_list("log")]
    assert any(
        m.startswith("warning skipped: maintenance-event was not queried since the last event") for m in messages
    )


def test_warning_is_shown_after_a_direct_query_and_needs_a_new_one_after_each_event(gce: VmClient) -> None:
    # GIVEN a VM that queried maintenance-event
    assert gce.gce("instance/maintenance-event").text == "NONE"
    # WHEN a migration is announced and finishes
    first = set_value(gce, "maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
    shown = gce.gce("instance/maintenance-event").text
    set_value(gce, "maintenance-event", "NONE")
    # ... and the next one comes without a new query in between
    second = set_value(gce, "maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    # THEN the first warning was shown, the second skipped
    assert first["shown"] is True
    assert shown == "MIGRATE_ON_HOST_MAINTENANCE"
    assert second["shown"] is False
    assert gce.gce("instance/maintenance-event").text == "NONE"


def test_require_watch_false_shows_the_value_anyway(gce: VmClient) -> None:
    # WHEN a migration is announced with require_watch false to a VM that never queried
    result = set_value(gce, "maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE", require_watch=False)
    # THEN it is shown
    assert result["shown"] is True
    assert gce.gce("instance/maintenance-event").text == "MIGRATE_ON_HOST_MAINTENANCE"


def test_gce_values_are_per_vm(start_sim: StartSim) -> None:
    # GIVEN two GCE VMs that both watch maintenance-event
    first, second = clients(start_sim(cloud="gce", vm_names=["g-0", "g-1"]))
    for vm in (first, second):
        vm.gce("instance/maintenance-event")
    # WHEN a migration is announced for g-1 through g-0's port
    result = first.post_ok("gce", {"vm": "g-1", "key": "maintenance-event", "value": "MIGRATE_ON_HOST_MAINTENANCE"})
    # THEN only g-1 sees it
    assert result["vm"] == "g-1"
    assert first.gce("instance/maintenance-event").text == "NONE"
    assert second.gce("instance/maintenance-event").text == "MIGRATE_ON_HOST_MAINTENANCE"


def test_directory_listing_and_redirect(gce: VmClient) -> None:
    # WHEN the instance directory is listed, recursively, and without its trailing slash
    listing = gce.gce("instance/").text.splitlines()
    recursive = gce.gce("instance/", params={"recursive": "true"}).json()
    redirect = gce.gce("instance")
    # THEN keys are listed, recursive JSON uses camelCase, and the bare directory redirects
    assert {"maintenance-event", "preempted", "name", "id", "zone"} <= set(listing)
    assert "upcoming-maintenance" not in listing
    assert recursive["maintenanceEvent"] == "NONE"
    assert redirect.status_code == 301
    assert redirect.headers["Location"].endswith("/computeMetadata/v1/instance/")
    assert json.dumps(recursive)


def test_metadata_is_read_only(gce: VmClient) -> None:
    # WHEN a client POSTs to a metadata key
    response = requests.post(
        f"{gce.base_url}/computeMetadata/v1/instance/maintenance-event",
        headers={"Metadata-Flavor": "Google"},
        timeout=5,
    )
    # THEN 405
    assert response.status_code == 405


def test_gce_values_tell_whether_maintenance_event_was_queried_since_the_last_event(start_sim: StartSim) -> None:
    # GIVEN a GCE simulator whose VM has only read its instance id
    sim = start_sim(cloud="gce")
    vm = clients(sim)[0]
    vm.gce("instance/id")
    assert sim.gce_values()[sim.vm_names[0]]["watched"] is False
    # WHEN the VM reads maintenance-event itself
    vm.gce("instance/maintenance-event")
    # THEN it is watched, and the values are there too
    values = sim.gce_values()[sim.vm_names[0]]
    assert values["watched"] is True
    assert values["maintenance-event"] == "NONE"


def test_an_azure_simulator_has_no_gce_values(start_sim: StartSim) -> None:
    assert start_sim(cloud="azure").gce_values() == {}
