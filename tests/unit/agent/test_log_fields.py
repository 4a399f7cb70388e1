"""The agent's log lines can be queried by event: the event id, kind, status, VM, cloud and envelope
are top-level keys of each JSON line, not only words in its message. Read from the records a real
agent writes while it watches the metadata simulator over HTTP, formatted as `mbridge agent` does."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from agent.hooks import HookRunner
from agent.logs import BASE_KEYS, JsonFormatter
from agent.messages import event_message
from agent.sources.azure.document import parse_scheduled_events
from agent.state import AgentState
from simulator import Simulator
from tests.agent_runner import AgentThread, settings_for
from tests.factories import azure_event
from tests.unit.agent.test_loop import FakeProcessor, FakeTransport, build
from tests.waiting import wait_until
from wire.envelope import event_envelope_id
from wire.model import Cloud, EventStatus
from wire.transports.base import InboundCommand

VM = "vm-0"
EVENT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"


def lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """Every record so far as the JSON object `mbridge agent` writes for it."""
    formatter = JsonFormatter()
    return [json.loads(formatter.format(record)) for record in caplog.records]


def strict_json(line: str) -> Any:
    """Parse as a strict JSON reader does: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)


def test_a_maintenance_seen_over_http_is_logged_with_its_fields_as_top_level_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, agent_thread: Callable[..., AgentThread]
) -> None:
    caplog.set_level(logging.INFO)
    with Simulator(cloud="azure", vm_names=[VM]) as sim:
        # GIVEN a running agent watching the simulator
        agent = agent_thread(settings_for("azure", sim.base_urls[0], VM, tmp_path, identity_proof="none"))
        # WHEN an event for its VM is scheduled and the agent publishes it
        requests.post(
            f"{sim.base_urls[0]}/_sim/events",
            json={"event_type": "Freeze", "event_id": EVENT_ID, "resources": [VM]},
            timeout=5,
        ).raise_for_status()
        (envelope,) = agent.wait_for_count(1)
        wait_until(
            lambda: any(line.get("message", "").startswith("published") for line in lines(caplog)),
            20,
            "the published line",
        )

    # THEN the line saying what the agent saw, and the one saying it went out, carry the event's
    # fields as top-level keys with the envelope id the bus got
    about = [line for line in lines(caplog) if line.get("event_id") == EVENT_ID]
    seen = next(line for line in about if line["logger"] == "mbridge.agent" and "freeze" in line["message"])
    assert {key: seen.get(key) for key in ("event_id", "cloud", "kind", "status", "vm", "envelope_id")} == {
        "event_id": EVENT_ID,
        "cloud": "azure",
        "kind": "freeze",
        "status": "scheduled",
        "vm": VM,
        "envelope_id": envelope["id"],
    }
    published = next(line for line in about if line["message"].startswith("published"))
    assert (published["envelope_id"], published["vm"], published["cloud"]) == (envelope["id"], VM, "azure")
    assert envelope["id"] == event_envelope_id(Cloud.AZURE, EVENT_ID, EventStatus.SCHEDULED)


def test_a_command_result_is_logged_with_its_command_event_and_vm(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN an agent with a command channel
    transport = FakeTransport()
    agent, _ = build(tmp_path, transport, commands=FakeProcessor(), state=AgentState(tmp_path / "agent.db"))
    caplog.set_level(logging.INFO)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    runner.start()
    try:
        # WHEN a command is received and answered
        transport.receiver.queued.append(InboundCommand(body=b"CMD-1", attributes={}, settle=lambda: None))
        wait_until(lambda: any(line.get("command_id") == "CMD-1" for line in lines(caplog)), 10, "the result line")
    finally:
        stop.set()
        runner.join(timeout=10)

    # THEN its line names the command, the event, the VM and the result as fields
    (line,) = [line for line in lines(caplog) if line.get("command_id") == "CMD-1"]
    assert {key: line.get(key) for key in ("command_id", "event_id", "vm", "result", "cloud")} == {
        "command_id": "CMD-1",
        "event_id": "E1",
        "vm": "WestNO_0",
        "result": "accepted",
        "cloud": "azure",
    }
    assert line["envelope_id"]


def test_a_field_named_like_a_key_of_every_line_goes_under_extra_and_replaces_nothing() -> None:
    # GIVEN a record whose `extra` uses names every line has
    record = logging.makeLogRecord({"msg": "hello", "levelname": "INFO", "levelno": 20, "name": "t"})
    record.__dict__.update({"time": "yesterday", "severity": "DEBUG", "logger": "other", "event_id": "E1"})

    # WHEN it is formatted
    line = strict_json(JsonFormatter().format(record))

    # THEN the line's own keys are intact, and what clashed is kept under "extra"
    assert (line["severity"], line["logger"], line["event_id"]) == ("INFO", "t", "E1")
    assert line["time"] != "yesterday"
    assert line["extra"] == {"time": "yesterday", "severity": "DEBUG", "logger": "other"}
    assert "extra" in BASE_KEYS


def test_field_values_that_json_cannot_hold_are_written_as_strict_json() -> None:
    # GIVEN values json.dumps would write as NaN, refuse (tuple keys), or not know (objects, bytes)
    record = logging.makeLogRecord({"msg": "odd values", "levelname": "INFO", "levelno": 20, "name": "t"})
    record.__dict__.update(
        {
            "ratio": math.nan,
            "limit": math.inf,
            "by_pair": {("a", 1): 2},
            "document": parse_scheduled_events('{"DocumentIncarnation": 1, "Events": []}'),
            "raw": b"\xff\xfe",
            "status": EventStatus.STARTED,
            "long": "x" * 100_000,
        }
    )

    # WHEN it is formatted THEN the line is strict JSON and each value is readable
    line = strict_json(JsonFormatter().format(record))
    assert (line["ratio"], line["limit"], line["status"]) == ("nan", "inf", "started")
    assert line["by_pair"] == {"('a', 1)": 2}
    assert isinstance(line["document"], str)
    assert isinstance(line["raw"], str)
    assert len(line["long"]) <= 2048


def test_a_message_whose_arguments_do_not_match_is_still_a_line() -> None:
    # GIVEN a call with one argument too few (a bug in a log call must not lose the line)
    record = logging.makeLogRecord({"msg": "%s and %s", "args": ("one",), "levelname": "WARNING", "levelno": 30})

    # WHEN it is formatted THEN both the format and its arguments are kept
    line = strict_json(JsonFormatter().format(record))
    assert "%s and %s" in line["message"]
    assert "one" in line["message"]


def test_an_event_cut_to_fit_a_bus_message_is_logged_with_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN an event whose raw entry is larger than a bus message holds
    event = azure_event(event_id=EVENT_ID, reporter=VM, resources=(VM,), raw={"Description": "x" * 400_000})

    # WHEN the agent makes its message
    with caplog.at_level(logging.WARNING, logger="mbridge.agent"):
        event_message(event, datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc))

    # THEN the line that says it was cut names the event in its fields, as every line about one does
    (cut,) = [line for line in lines(caplog) if "are cut" in line["message"]]
    assert (cut["event_id"], cut["vm"], cut["cloud"]) == (EVENT_ID, VM, "azure")


@pytest.mark.skipif(
    shutil.which("jq") is None and os.environ.get("CI") != "true",
    reason="the guide's recipe is a jq program (CI installs jq, and fails without it)",
)
def test_the_operations_guide_s_jq_recipe_finds_every_line_of_an_event(caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN the guide's recipe for everything about one event on a VM (journald, one JSON line each)
    guide = (Path(__file__).parents[3] / "docs" / "operations.md").read_text(encoding="utf-8")
    (recipe,) = [line for line in guide.splitlines() if line.startswith("journalctl") and "select(.event_id" in line]
    program = shlex.split(recipe.split("| jq", 1)[1])
    sample_id = re.search(r'\.event_id == "([^"]+)"', recipe)
    assert sample_id is not None
    # ... and what the journal of the agent's unit holds: systemd's own words, then the agent's lines
    # about an event (its hook run among them) and another event's
    caplog.set_level(logging.INFO, logger="mbridge.agent")
    runner = HookRunner([sys.executable, "-c", "pass"], timeout=30.0)
    runner.notify(azure_event(event_id=sample_id.group(1), reporter=VM, resources=(VM,)))
    runner.notify(azure_event(event_id="OTHER-EVENT", reporter=VM, resources=(VM,)))
    assert runner.settle(20.0)
    journal = ["Started mbridge-agent.service - maintenance-bridge agent.", *map(json.dumps, lines(caplog))]

    # WHEN the recipe reads it
    found = subprocess.run(
        ["jq", *program], input="\n".join(journal) + "\n", capture_output=True, text=True, check=False, timeout=30
    )

    # THEN it finds the event's hook line, and only the event's lines
    assert found.returncode == 0, found.stderr
    messages = [json.loads(line)["message"] for line in found.stdout.splitlines()]
    assert messages == [f"hook for {sample_id.group(1)} scheduled: exit 0 in " + messages[0].rsplit(" in ", 1)[1]]
