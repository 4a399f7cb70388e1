"""A VM whose agent is dead, handled from the control plane: the simulator's central feed (Event Grid
events, docs/simulator.md) read by the local app's reader (functions/local_app/central.py) into
the core, against the simulator over HTTP.

No agent runs here: every report comes from the control plane.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import pytest
import requests

from functions.central.event_grid import AzureScope
from functions.central.gce_upcoming import GceScope
from functions.core.central import WATCH_LINE
from functions.core.policy import Policy
from functions.core.ports import ActionName, AuditKind
from functions.core.process import Deps
from functions.local_app.balancer import LocalPool
from functions.local_app.central import CentralFeedReader, azure_reports, gce_reports
from functions.local_app.recording import Recorder
from functions.local_app.replay import PRINTED, replay, reporter_names
from functions.local_app.store import SqliteStore
from simulator import Simulator
from simulator.azure_api import SIM_RESOURCE_GROUP, SIM_SUBSCRIPTION_ID
from simulator.gce_api.project import PROJECT_ID
from tests.kit import FakeClock, RecordingSender
from tests.waiting import wait_until
from wire.timefmt import format_rfc3339

VMS = ("web-0", "web-1")
SILENT_AFTER = 60.0
POLICY = replace(Policy(), silent_agents="drain", silent_agent_seconds=SILENT_AFTER)


@dataclass
class World:
    sim: Simulator
    store: SqliteStore
    pool: LocalPool
    sent: RecordingSender
    clock: FakeClock
    reader: CentralFeedReader
    recorder: Recorder | None = None

    def inject(self, **body: object) -> str:
        answer = requests.post(f"{self.sim.base_urls[0]}/_sim/events", json=body, timeout=10)
        assert answer.status_code in (200, 201), answer.text
        return str(answer.json()["EventId"])

    def read_until(self, predicate_text: str, predicate: object) -> None:
        def done() -> bool:
            self.reader.step()
            return bool(predicate())  # type: ignore[operator]

        wait_until(done, 10, predicate_text)

    def audited(self, kind: str, action: str = "") -> list[str]:
        return [r.vm for r in self.store.query() if r.kind == kind and (not action or r.action == action)]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with Simulator(cloud="azure", vm_names=list(VMS)) as sim:
        store, pool, sent, clock = SqliteStore(":memory:"), LocalPool(":memory:"), RecordingSender(), FakeClock()
        pool.add("web", VMS)
        deps = Deps(store, pool, sent, store, POLICY, monotonic=clock.monotonic)
        scope = AzureScope(subscriptions=(SIM_SUBSCRIPTION_ID,), resource_groups=(SIM_RESOURCE_GROUP,))
        recorder = Recorder(tmp_path / "recorded.jsonl")
        reader = CentralFeedReader(sim.base_urls[0], deps, azure_reports(scope), clock.now, recorder=recorder)
        yield World(sim, store, pool, sent, clock, reader, recorder)
        reader.close()
        recorder.close()
        store.close()
        pool.close()


def test_a_dead_agents_vm_is_found_silent_drained_and_put_back_from_the_control_plane(world: World) -> None:
    # GIVEN web-1's agent is dead, WHEN Azure schedules a Reboot of web-1
    event_id = world.inject(event_type="Reboot", resources=["web-1"])

    # THEN the control plane's report of it is watched
    world.read_until("the central Scheduled", lambda: world.store.parked(WATCH_LINE))

    # WHEN no agent reports it for the bound
    world.clock.advance(timedelta(seconds=SILENT_AFTER + 60))
    world.reader.step()

    # THEN web-1's agent is found silent, and web-1 is taken out of its pool on the centre's word
    assert world.audited(AuditKind.AGENT_SILENT) == ["web-1"]
    assert world.pool.members("web") == ["web-0"]
    assert world.sent.commands == []  # never approved from the control plane

    # WHEN Azure starts the Reboot at its NotBefore and it completes
    world.sim.advance_clock(15 * 60)
    world.sim.advance_clock(20 * 60)

    # THEN the control plane's Completed puts web-1 back
    world.read_until("web-1 back", lambda: sorted(world.pool.members("web")) == list(VMS))
    assert world.audited(AuditKind.ACTION, ActionName.RESTORE) == ["web-1"]
    assert any(r.event_id == event_id for r in world.store.query())

    # AND what the reader recorded (its reports and sweeps, with their times) replays to what it audited
    assert world.recorder is not None
    world.recorder.close()
    out, err = io.StringIO(), io.StringIO()
    lines = world.recorder.path.read_text(encoding="utf-8").splitlines()
    assert replay(lines, POLICY, reporter_names(), out, err) == 0
    printed = [json.loads(line) for line in out.getvalue().splitlines()]
    audited = [r for r in world.store.query() if r.kind in PRINTED]
    assert [(p["kind"], p["action"], p["vm"], p["event_id"], p["time"]) for p in printed] == [
        (r.kind, r.action, r.vm, r.event_id, format_rfc3339(r.time)) for r in audited
    ]
    assert [p["kind"] for p in printed] == ["agent-silent", "action", "action"]


def test_a_dead_agents_gce_window_is_found_silent_drained_for_while_open_and_put_back() -> None:
    with Simulator(cloud="gce", vm_names=["gce-0"]) as sim:
        store, pool, sent, clock = SqliteStore(":memory:"), LocalPool(":memory:"), RecordingSender(), FakeClock()
        pool.add("gce", ["gce-0"])
        deps = Deps(store, pool, sent, store, POLICY, monotonic=clock.monotonic)
        reader = CentralFeedReader(sim.base_urls[0], deps, gce_reports(GceScope(projects=(PROJECT_ID,))), clock.now)
        world = World(sim, store, pool, sent, clock, reader)
        try:
            # GIVEN gce-0's agent is dead, WHEN GCE schedules a maintenance window on it
            window = {"window_start_in": 3600, "window_length": 3600}
            set_gce = f"{sim.base_urls[0]}/_sim/gce"
            assert requests.post(set_gce, json={"key": "upcoming-maintenance", "value": window}, timeout=10).ok

            # THEN the log's report is watched, and after the bound the agent found silent (audit only)
            world.read_until("the scheduled window", lambda: store.parked(WATCH_LINE))
            clock.advance(timedelta(seconds=SILENT_AFTER))
            reader.step()
            assert world.audited(AuditKind.AGENT_SILENT) == ["gce-0"]
            assert pool.members("gce") == ["gce-0"]

            # WHEN the window opens, and the bound passes again
            opened = {"key": "upcoming-maintenance", "value": {"maintenanceStatus": "ONGOING"}}
            assert requests.post(set_gce, json=opened, timeout=10).ok
            world.read_until("the open window", lambda: store.parked(WATCH_LINE))
            clock.advance(timedelta(seconds=SILENT_AFTER))
            reader.step()

            # THEN gce-0 is out of its pool for the window; WHEN the window is over THEN it is back
            assert pool.members("gce") == []
            assert requests.post(set_gce, json={"key": "upcoming-maintenance", "value": None}, timeout=10).ok
            world.read_until("gce-0 back", lambda: pool.members("gce") == ["gce-0"])
            assert world.audited(AuditKind.ACTION, ActionName.RESTORE) == ["gce-0"]
            assert sent.commands == []
        finally:
            reader.close()
            store.close()
            pool.close()
