"""Faults on demand: rate limit, error bursts, latency, first-call delay, malformed bodies, dropped connections."""

from __future__ import annotations

import json
import time

import pytest
import requests

from tests.contract.simulator.conftest import StartSim, VmClient, clients


def test_azure_rate_limit_is_on_by_default(start_sim: StartSim) -> None:
    # GIVEN an Azure simulator with its default faults
    vm = clients(start_sim(cloud="azure", rate_limit=True))[0]
    assert vm.state()["faults"]["vm-0"]["rate_limit"] is True
    # WHEN six requests arrive within one second
    codes = [vm.get_events().status_code for _ in range(6)]
    # THEN the sixth is 429 ("Too many requests"), the control API is never limited ...
    assert codes == [200, 200, 200, 200, 200, 429]
    assert all(vm.control("GET", "state").status_code == 200 for _ in range(8))
    # ... and after a second the VM is served again
    time.sleep(1.05)
    assert vm.get_events().status_code == 200


def test_rate_limit_can_be_switched_off(start_sim: StartSim) -> None:
    # GIVEN an Azure simulator with the rate limit switched off (for benchmarks)
    vm = clients(start_sim(cloud="azure", rate_limit=True))[0]
    vm.post_ok("faults", {"rate_limit": False})
    # WHEN many requests arrive at once
    codes = {vm.get_events().status_code for _ in range(12)}
    # THEN none is throttled
    assert codes == {200}


def test_gce_has_no_rate_limit_by_default(gce: VmClient) -> None:
    # WHEN a GCE client asks many times in a row
    codes = {gce.gce("instance/maintenance-event").status_code for _ in range(12)}
    # THEN all are served
    assert codes == {200}


def test_error_burst_answers_the_next_requests_with_a_status(azure: VmClient) -> None:
    # GIVEN a burst of two 503s
    azure.post_ok("faults", {"error_burst": {"status": 503, "count": 2}})
    # WHEN three requests follow
    responses = [azure.get_events() for _ in range(3)]
    # THEN two 503 with a plain body, then the document again
    assert [r.status_code for r in responses] == [503, 503, 200]
    assert responses[0].headers["Content-Type"].startswith("text/plain")
    assert "Service Unavailable" in responses[0].text
    assert responses[2].json()["DocumentIncarnation"] == 1


def test_error_burst_on_an_approval_is_logged_and_applies_nothing(azure: VmClient) -> None:
    # GIVEN a Scheduled event and a burst of one 500
    azure.add_event(event_type="Reboot", event_id="E1")
    azure.post_ok("faults", {"error_burst": {"status": 500, "count": 1}})
    # WHEN the VM approves
    response = azure.approve("E1")
    azure.advance(5)
    # THEN it got the 500, the event is still Scheduled, and the attempt is in the approval log
    assert response.status_code == 500
    assert azure.events()["Events"][0]["EventStatus"] == "Scheduled"
    assert [(a["status"], a["outcome"], a["event_ids"]) for a in azure.get_list("approvals")] == [
        (500, "error-burst", ["E1"])
    ]


def test_gce_error_burst_keeps_the_flavor_header(gce: VmClient) -> None:
    # GIVEN a burst of one 503 (GCE can answer 503 during maintenance)
    gce.post_ok("faults", {"error_burst": {"status": 503, "count": 1}})
    # WHEN two requests follow
    first, second = gce.gce("instance/maintenance-event"), gce.gce("instance/maintenance-event")
    # THEN a 503 from the metadata server, then the value
    assert first.status_code == 503
    assert first.headers["Metadata-Flavor"] == "Google"
    assert second.text == "NONE"


def test_latency_delays_every_metadata_request(azure: VmClient) -> None:
    # GIVEN 1.2 s of added latency
    azure.post_ok("faults", {"latency_ms": 1200})
    # WHEN a metadata request and a control request are timed
    began = time.monotonic()
    assert azure.get_events().status_code == 200
    metadata_took = time.monotonic() - began
    began = time.monotonic()
    assert azure.state()["faults"]["vm-0"]["latency_ms"] == 1200
    control_took = time.monotonic() - began
    # THEN the metadata answer waited at least the latency; the control API did not
    assert metadata_took >= 1.2
    assert control_took < 0.6


def test_first_call_delay_delays_only_the_first_scheduled_events_request(start_sim: StartSim) -> None:
    # GIVEN a first-call delay of 150 documented seconds at speed 100 (1.5 real seconds)
    vm = clients(start_sim(cloud="azure", speed=100))[0]
    vm.post_ok("faults", {"first_call_delay": 150})
    # WHEN the instance endpoint, then Scheduled Events twice, are called
    began = time.monotonic()
    name = requests.get(
        f"{vm.base_url}/metadata/instance/compute/name",
        params={"api-version": "2021-02-01", "format": "text"},
        headers={"Metadata": "true"},
        timeout=10,
    )
    instance_took = time.monotonic() - began
    began = time.monotonic()
    assert vm.get_events().status_code == 200
    first_took = time.monotonic() - began
    began = time.monotonic()
    assert vm.get_events().status_code == 200
    second_took = time.monotonic() - began
    # THEN only the first Scheduled Events call waited
    assert name.text == "vm-0"
    assert instance_took < 1.0
    assert first_took >= 1.5
    assert second_took < 1.0
    assert vm.state()["faults"]["vm-0"]["first_call_delay"] == 0


def test_malformed_azure_document_is_truncated_json(azure: VmClient) -> None:
    # GIVEN one malformed answer armed
    azure.post_ok("faults", {"malformed": 1})
    # WHEN the document is read twice
    broken, good = azure.get_events(), azure.get_events()
    # THEN the first is a 200 whose body is not JSON, the second is the real document
    assert broken.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken.text)
    assert broken.text
    assert '{"DocumentIncarnation": 1, "Events": []}'.startswith(broken.text)
    assert good.json() == {"DocumentIncarnation": 1, "Events": []}


def test_malformed_gce_answers(gce: VmClient) -> None:
    # GIVEN an announced window and two malformed answers armed
    gce.post_ok("gce", {"key": "upcoming-maintenance", "value": {"window_start_in": 600}})
    gce.post_ok("faults", {"malformed": 2})
    # WHEN upcoming-maintenance and then a plain key are read
    upcoming = gce.gce("instance/upcoming-maintenance")
    plain = gce.gce("instance/maintenance-event")
    # THEN upcoming is the docs' comma-less pseudo-JSON and the plain key is garbage, both 200
    assert upcoming.status_code == plain.status_code == 200
    assert '"maintenanceType":"SCHEDULED"\n' in upcoming.text
    with pytest.raises(json.JSONDecodeError):
        json.loads(upcoming.text)
    assert plain.content != b"NONE"
    # THEN the next answers are good again
    assert gce.gce("instance/upcoming-maintenance").json()["maintenanceStatus"] == "PENDING"
    assert gce.gce("instance/maintenance-event").text == "NONE"


def test_dropped_connections_get_no_answer(azure: VmClient) -> None:
    # GIVEN two dropped connections armed and a Scheduled event
    azure.add_event(event_type="Reboot", event_id="D1")
    azure.post_ok("faults", {"drop": 2})
    # WHEN a GET and an approval are sent
    with pytest.raises(requests.ConnectionError):
        azure.get_events()
    with pytest.raises(requests.ConnectionError):
        azure.approve("D1")
    # THEN the next request is answered; the lost approval is logged without a status and applied nothing
    assert azure.get_events().status_code == 200
    assert [(a["status"], a["outcome"]) for a in azure.get_list("approvals")] == [(None, "dropped")]
    assert azure.events()["Events"][0]["EventStatus"] == "Scheduled"


def attested_document(vm: VmClient) -> requests.Response:
    return requests.get(
        f"{vm.base_url}/metadata/attested/document",
        params={"api-version": "2020-09-01", "nonce": "1234567890"},
        headers={"Metadata": "true"},
        timeout=10,
    )


@pytest.mark.parametrize("status", [404, 400])
def test_refused_proofs_answer_the_attested_document_with_a_status_until_lifted(azure: VmClient, status: int) -> None:
    # GIVEN an IMDS that refuses the attested document (as Microsoft's Scheduled Events mock server does)
    azure.post_ok("faults", {"refuse_proofs": status})
    # WHEN the attested document is asked for, twice, and the events are read
    refused = [attested_document(azure) for _ in range(2)]
    # THEN every attested request gets the status, and the rest of IMDS answers as usual
    assert [r.status_code for r in refused] == [status, status]
    assert azure.get_events().status_code == 200
    assert azure.state()["faults"]["vm-0"]["refuse_proofs"] == status
    # AND once lifted, the document comes again
    azure.post_ok("faults", {"refuse_proofs": 0})
    assert attested_document(azure).json()["encoding"] == "pkcs7"


def test_refused_proofs_answer_the_gce_identity_endpoint_with_a_status(gce: VmClient) -> None:
    # GIVEN a metadata server that refuses identity tokens
    gce.post_ok("faults", {"refuse_proofs": 404})
    identity = "instance/service-accounts/default/identity"
    # WHEN a token and a value are read
    refused = gce.gce(identity, {"audience": "maintenance-bridge"})
    # THEN the token is refused with the metadata server's header, the value is served
    assert refused.status_code == 404
    assert refused.headers["Metadata-Flavor"] == "Google"
    assert gce.gce("instance/maintenance-event").text == "NONE"
    gce.post_ok("faults", {"refuse_proofs": 0})
    assert gce.gce(identity, {"audience": "maintenance-bridge"}).text.count(".") == 2


def test_faults_never_apply_to_the_control_api(azure: VmClient) -> None:
    # GIVEN drops, errors and malformed answers armed
    azure.post_ok("faults", {"drop": 1, "error_burst": {"status": 503, "count": 1}, "malformed": 1})
    # WHEN the control API is used repeatedly
    states = [azure.state() for _ in range(3)]
    # THEN it answers normally and nothing was consumed
    assert states[-1]["faults"]["vm-0"] == {
        "rate_limit": False,
        "error_burst": {"status": 503, "count": 1},
        "latency_ms": 0,
        "first_call_delay": 0.0,
        "malformed": 1,
        "drop": 1,
        "refuse_proofs": 0,
    }


def test_faults_can_target_one_vm(start_sim: StartSim) -> None:
    # GIVEN two VMs and an error burst for the second one only ("$1")
    first, second = clients(start_sim(cloud="azure", vm_names=["f-0", "f-1"]))
    first.post_ok("faults", {"vm": "$1", "error_burst": {"status": 500, "count": 1}})
    # WHEN both read their document
    # THEN only the second gets the error
    assert first.get_events().status_code == 200
    assert second.get_events().status_code == 500


def test_fault_requests_are_validated(azure: VmClient) -> None:
    # WHEN fault bodies are wrong
    unknown = azure.control("POST", "faults", {"explode": True})
    empty = azure.control("POST", "faults", {})
    bad_status = azure.control("POST", "faults", {"error_burst": {"status": 200, "count": 1}})
    bad_vm = azure.control("POST", "faults", {"vm": "nobody", "drop": 1})
    bad_refusal = azure.control("POST", "faults", {"refuse_proofs": 503})  # a refusal is a 4xx; error_burst has 5xx
    # THEN 400 with a message that names the field
    assert [r.status_code for r in (unknown, empty, bad_status, bad_vm, bad_refusal)] == [400] * 5
    assert "refuse_proofs" in bad_refusal.json()["error"]
    assert "explode" in unknown.json()["error"]
    assert "error_burst.status" in bad_status.json()["error"]
    assert "nobody" in bad_vm.json()["error"]


def test_traffic_counts_requests_by_status_and_the_busiest_second(start_sim: StartSim) -> None:
    # GIVEN an Azure VM with the rate limit on
    sim = start_sim(cloud="azure", vm_names=["vm-0"], rate_limit=True)
    url = f"{sim.base_urls[0]}/metadata/scheduledevents"

    # WHEN a client sends 8 requests as fast as it can
    for _ in range(8):
        requests.get(url, headers={"Metadata": "true"}, params={"api-version": "2020-07-01"}, timeout=5)

    # THEN the simulator counted 5 answered and 3 refused, all within one second
    traffic = requests.get(f"{sim.base_urls[0]}/_sim/traffic", timeout=5).json()["vm-0"]
    assert traffic["total"] == 8
    assert traffic["by_status"] == {"200": 5, "429": 3}
    assert traffic["max_per_second"] == 8
    assert sim.traffic() == {"vm-0": traffic}
