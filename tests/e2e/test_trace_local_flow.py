"""One maintenance, one trace, end to end on one machine: simulator → agent → embedded bus →
function core → signed command → the agent's approval POST → completion. The trace id the agent
starts when it detects the event is the one in its log lines, every envelope of the event, every
audit record, the command, and the agent's record of the approval it POSTed."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from agent.commands import CommandLedger
from agent.logs import JsonFormatter
from agent.main import LEDGER_DB
from functions.local_app.store import SqliteStore
from mbridge.cli import main
from simulator import Simulator
from tests.agent_runner import AgentThread
from tests.e2e.local_host import Deployment, commands_sent, event_status, running_host
from tests.waiting import wait_until
from wire.commands import CommandType, decode_command
from wire.envelope import decode
from wire.model import MaintenanceEvent
from wire.transports.local import LocalBus

SET = ["web-0", "web-1"]
EVENT_ID = "5D2C7E1A-9B3F-4C61-8E0A-2F4B6D8C1E37"


def test_one_maintenance_is_one_trace_from_detection_to_the_approval_post_and_its_end(
    tmp_path: Path,
    agent_thread: Callable[..., AgentThread],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN web-0's agent on the embedded bus with signed commands, and the function host
    caplog.set_level(logging.INFO)
    deployment = Deployment.make(tmp_path, SET)
    bus_path, pool, store = deployment.bus_path, deployment.pool, deployment.store
    with Simulator(cloud="azure", vm_names=SET, speed=10) as sim:
        agent = agent_thread(deployment.agent(sim.base_urls[0], "web-0"))
        with running_host(sim, deployment):
            # WHEN Azure schedules a platform Reboot of web-0, it is drained, approved and started,
            # and then the maintenance ends and web-0 comes back
            requests.post(
                f"{sim.base_urls[0]}/_sim/events",
                json={"event_type": "Reboot", "resources": ["web-0"], "event_id": EVENT_ID},
                timeout=5,
            ).raise_for_status()
            wait_until(lambda: len(sim.approvals()) == 1, 20, "the approval POST")
            wait_until(lambda: event_status(sim) == "Started", 20, "the event to start")
            requests.post(f"{sim.base_urls[0]}/_sim/events/{EVENT_ID}/advance", timeout=5).raise_for_status()
            wait_until(lambda: pool.members("web") == SET, 20, lambda: f"restored pool, got {pool.members('web')}")
            wait_until(lambda: _results_audited(store) == 1, 20, "the approval's result in the audit log")
        agent.halt()

    # THEN the agent's envelopes of the event, scheduled to completed, carry one trace (a reboot
    # this short may be over before the agent reads it started)
    envelopes = [decode(event.body) for event in LocalBus(bus_path).read_events(0)]
    statuses = [e.data.status.value for e in envelopes if isinstance(e.data, MaintenanceEvent)]
    assert statuses[0] == "scheduled"
    assert statuses[-1] == "completed"
    (trace_id,) = {_trace_id(str(e.extensions["traceparent"])) for e in envelopes}  # the result's too
    # AND it is in the agent's log, as a field of its JSON lines: the detection, each publish, the
    # command received and the approval POSTed
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records if r.name.startswith("mbridge.")]
    traced = [line["message"] for line in lines if line.get("trace_id") == trace_id]
    assert any(m.startswith("reboot") and m.endswith("scheduled (concerns this VM)") for m in traced)
    assert sum(m.startswith("published envelope") for m in traced) == len(envelopes)
    assert any(m.startswith("received approve command") for m in traced)
    assert any("approved: StartRequests POSTed" in m for m in traced)
    # AND every audit record of the event carries it: the reports, decisions, actions and the result
    records = store.query(event_id=EVENT_ID)
    assert {r.kind for r in records} >= {"event", "decision", "action", "command-result"}
    assert {r.trace_id for r in records} == {trace_id}
    assert main(["audit", "list", "--db", str(tmp_path / "functions.db"), "--event", EVENT_ID]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(printed) == len(records)
    assert {line["trace_id"] for line in printed} == {trace_id}
    # AND so does the signed command, as it travelled on the bus
    (command,) = [decode_command(body).command for body in commands_sent(bus_path)]
    assert command.type is CommandType.APPROVE
    assert command.trace is not None
    assert command.trace.trace_id == trace_id
    # AND the agent's record of the approval it carried out
    ledger = CommandLedger(tmp_path / "web-0" / LEDGER_DB)
    try:
        entry = ledger.get(command.command_id)
    finally:
        ledger.close()
    assert entry is not None
    assert entry.result is not None
    assert entry.result.accepted
    assert entry.trace_id == trace_id
    store.close()


def _trace_id(traceparent: str) -> str:
    version, trace_id, _, _ = traceparent.split("-")
    assert version == "00"
    return trace_id


def _results_audited(store: SqliteStore) -> int:
    return sum(r.kind == "command-result" for r in store.query(event_id=EVENT_ID))
