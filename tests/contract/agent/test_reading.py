"""How the agent reads the metadata service over HTTP: entry by entry, leniently where that is safe,
and right about how an event ended across a restart."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from simulator import Simulator
from tests.agent_runner import AgentThread, settings_for
from tests.waiting import wait_until

ODD_OTHER_VM_ENTRY = {
    # Another VM's event broadcast to the availability set, with values this release cannot read.
    "EventId": "0A3F5A1B-0000-4000-8000-000000000001",
    "EventType": "Hibernate",
    "ResourceType": "VirtualMachine",
    "Resources": ["vm-7"],
    "EventStatus": "Pending",
    "NotBefore": "in a while",
    "EventSource": "Cosmic",
}
MY_ENTRY = {
    # This VM's own Reboot, as some IMDS emulators print it: lower-case enums, ISO 8601 NotBefore.
    "EventId": "0A3F5A1B-0000-4000-8000-000000000002",
    "EventType": "reboot",
    "ResourceType": "VirtualMachine",
    "Resources": ["vm-0"],
    "EventStatus": "scheduled",
    "NotBefore": "2031-05-06T07:08:09Z",
    "EventSource": "platform",
    "DurationInSeconds": -1,
}


class FixedAnswers:
    """Another metadata emulator: answers each path (query left out) with the text it is given,
    with a fixed ETag, and 404 for any other path."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = {path: text.encode() for path, text in answers.items()}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = owner.answers.get(self.path.split("?", 1)[0])
                self.send_response(404 if body is None else 200)
                self.send_header("ETag", "fixed")
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, format: str, *args: object) -> None:
                """Quiet: the test asserts on what the agent reports."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def metadata() -> Iterator[Callable[[dict[str, str]], FixedAnswers]]:
    started: list[FixedAnswers] = []

    def start(answers: dict[str, str]) -> FixedAnswers:
        server = FixedAnswers(answers)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def test_an_entry_the_agent_cannot_read_does_not_silence_the_vms_own_event(
    tmp_path: Path, agent_thread: Callable[..., AgentThread], metadata: Callable[[dict[str, str]], FixedAnswers]
) -> None:
    # GIVEN a document holding another VM's odd entry before this VM's own Reboot
    document = {"DocumentIncarnation": 7, "Events": [ODD_OTHER_VM_ENTRY, MY_ENTRY]}
    server = metadata({"/metadata/scheduledevents": json.dumps(document)})

    # WHEN the agent reads it, forwarding every event it sees (the fixed answers hold no attested
    # document: no proof is asked for)
    settings = settings_for("azure", server.url, "vm-0", tmp_path, forward="all", identity_proof="none")
    agent = agent_thread(settings)
    envelopes = agent.wait_for_count(2)

    # THEN both entries are forwarded: its own event fully read, the odd one with what could be read
    by_id = {e["data"]["event_id"]: e["data"] for e in envelopes}
    mine, odd = by_id[MY_ENTRY["EventId"]], by_id[ODD_OTHER_VM_ENTRY["EventId"]]
    assert (mine["kind"], mine["status"], mine["not_before"]) == ("reboot", "scheduled", "2031-05-06T07:08:09Z")
    assert (mine["event_source"], mine["concerns_reporter"], "unreadable" in mine) == ("platform", True, False)
    assert (odd["kind"], odd["status"], odd["not_before"], odd["resources"]) == ("unknown", "scheduled", None, ["vm-7"])
    assert sorted(odd["unreadable"]) == ["EventSource", "EventStatus", "EventType", "NotBefore"]
    assert odd["raw"] == ODD_OTHER_VM_ENTRY


def test_a_gce_maintenance_value_google_added_is_reported_as_a_maintenance_of_kind_unknown(
    tmp_path: Path, agent_thread: Callable[..., AgentThread], metadata: Callable[[dict[str, str]], FixedAnswers]
) -> None:
    # GIVEN a GCE metadata server announcing a maintenance-event value this release does not know
    prefix = "/computeMetadata/v1/instance/"
    answers = {"id": "4113390128391523715", "maintenance-event": "SUSPEND_ON_HOST_MAINTENANCE", "preempted": "FALSE"}
    server = metadata({prefix + key: value for key, value in answers.items()})

    # WHEN the agent watches it
    agent = agent_thread(settings_for("gce", server.url, "gce-0", tmp_path, identity_proof="none"))
    (envelope,) = agent.wait_for_count(1)

    # THEN it is reported as a maintenance of kind unknown (the policy drains for it)
    data = envelope["data"]
    assert (data["kind"], data["status"], data["not_before"]) == ("unknown", "scheduled", None)
    assert data["raw"] == {"key": "maintenance-event", "value": "SUSPEND_ON_HOST_MAINTENANCE"}


@pytest.mark.slow
def test_an_event_that_ran_while_the_agent_was_stopped_is_reported_completed(
    tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    # GIVEN IMDS at 300 times the documented pace (a Reboot's 15 minutes of notice last 3 real seconds)
    with Simulator(cloud="azure", vm_names=["vm-0"], speed=300) as sim:
        settings = settings_for("azure", sim.base_urls[0], "vm-0", tmp_path)
        body = {"event_type": "Reboot", "resources": ["vm-0"], "event_id": "E-REBOOT", "notice": 900}
        requests.post(f"{sim.base_urls[0]}/_sim/events", json=body, timeout=5).raise_for_status()
        first = agent_thread(settings)
        first.wait_for_count(1)

        # WHEN the agent is stopped (the reboot takes it down), the event starts at its NotBefore and
        # is removed, and the agent starts again
        first.halt()
        wait_until(lambda: not requests.get(f"{sim.base_urls[0]}/_sim/events", timeout=5).json(), 30, "the end")
        second = agent_thread(settings)
        envelopes = second.wait_for_count(2)
        time.sleep(1.0)  # room for anything else it would wrongly report

    # THEN the event is reported completed, not canceled (it ran; a canceled Terminate would even be put back)
    assert [e["data"]["status"] for e in second.envelopes()] == ["scheduled", "completed"]
    assert envelopes[1]["data"]["event_id"] == "E-REBOOT"


def test_an_older_api_version_is_read_with_the_fields_it_has(
    tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    # GIVEN an agent told to use 2019-08-01, the newest version the Azure China docs list
    with Simulator(cloud="azure", vm_names=["vm-0"]) as sim:
        settings = settings_for("azure", sim.base_urls[0], "vm-0", tmp_path, api_version="2019-08-01")
        agent = agent_thread(settings)
        body = {"event_type": "Reboot", "resources": ["vm-0"], "event_id": "E-OLD"}
        requests.post(f"{sim.base_urls[0]}/_sim/events", json=body, timeout=5).raise_for_status()

        # WHEN an event appears
        (envelope,) = agent.wait_for_count(1)

    # THEN it is read from that version's document (no DurationInSeconds before 2020-07-01) and forwarded
    data = envelope["data"]
    assert (data["kind"], data["status"], data["duration_seconds"]) == ("reboot", "scheduled", None)
    assert "DurationInSeconds" not in data["raw"]
    assert data["raw"]["EventSource"] == "Platform"
