"""The control plane's path on Cloud Functions (functions/gcp_app/central_entry.py): the log sink's
system-event entries and the scheduler's tick, called directly and over HTTP through the functions
framework as the push subscriptions call them.

Deps are the SQLite store and small fakes of our own ports, set through `wiring.override`.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import functions_framework
import pytest
from cloudevents.conversion import to_structured

from functions.central.gce_upcoming import GceScope
from functions.core.central import WATCH_LINE
from functions.core.policy import Policy
from functions.core.ports import ActionName, AuditKind
from functions.core.process import Deps
from functions.gcp_app import central_entry, wiring
from functions.gcp_app.central_entry import handle_log_entry, handle_tick
from functions.local_app.store import SqliteStore
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from tests.unit.gcp.test_central_system_events import INSTANCE_ID, MIGRATE, PROJECT, upcoming
from tests.unit.gcp.test_entry import NOW, published
from wire.identity import ReporterName

ROOT = Path(__file__).resolve().parents[3]
SCOPE = GceScope(projects=(PROJECT,))


@dataclass
class World:
    store: SqliteStore
    balancer: FakeBalancer
    deps: Deps

    def kinds(self) -> list[str]:
        return [record.kind for record in self.store.query()]


@pytest.fixture
def world() -> Iterator[World]:
    store = SqliteStore(":memory:")
    balancer = FakeBalancer({"gce": ["gce-0", "gce-1"]})
    deps = Deps(
        store=store,
        balancer=balancer,
        sender=RecordingSender(),
        audit=store,
        policy=replace(Policy(), silent_agents="drain"),
        verifier=ReporterName(),
        monotonic=FakeClock().monotonic,
    )
    with wiring.override(deps):
        yield World(store, balancer, deps)
    store.close()


def as_message(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry).encode()


def test_a_silent_agents_window_is_audited_drained_for_while_open_and_ended_by_the_log(world: World) -> None:
    # GIVEN the sink's entry of a window scheduled on gce-0, whose agent never reports it
    bound = timedelta(seconds=world.deps.policy.silent_agent_seconds)
    outcomes = handle_log_entry(as_message(upcoming("Maintenance window is scheduled")), world.deps, SCOPE, NOW)

    # THEN it is audited as the control plane's, and watched
    assert len(outcomes) == 1
    events = [record for record in world.store.query() if record.kind == AuditKind.EVENT]
    assert events[0].detail["sender"] == (
        f"control plane: gce-system-event as projects/{PROJECT}/zones/us-central1-a/instances/gce-0 (id {INSTANCE_ID})"
    )
    assert len(list(world.store.parked(WATCH_LINE))) == 1

    # WHEN the scheduler's ticks come, before and at the bound (policy silent_agents: drain)
    assert handle_tick(world.deps, NOW + bound / 2) == []
    scheduled = handle_tick(world.deps, NOW + bound)

    # THEN gce-0's agent is found silent; an advance notice is audited only, as the agent's would be
    assert [taken.action for outcome in scheduled for taken in outcome.actions] == [ActionName.NONE]
    assert world.balancer.drained == []

    # WHEN the window opens, and the bound passes again with no word from the agent
    opened_at = NOW + timedelta(hours=1)
    handle_log_entry(as_message(upcoming("Maintenance window is ongoing")), world.deps, SCOPE, opened_at)
    ongoing = handle_tick(world.deps, opened_at + bound)

    # THEN gce-0 leaves its pool for the window, and the window's end puts it back
    assert [taken.action for outcome in ongoing for taken in outcome.actions] == [ActionName.DRAIN]
    assert world.balancer.drained == ["gce-0"]
    assert world.kinds().count(AuditKind.AGENT_SILENT) == 2
    handle_log_entry(as_message(upcoming("Maintenance window has completed")), world.deps, SCOPE, opened_at + bound * 2)
    assert world.balancer.restored == ["gce-0"]


def test_a_repeated_entry_never_acts_twice(world: World) -> None:
    handle_log_entry(as_message(MIGRATE), world.deps, SCOPE, NOW)
    handle_log_entry(as_message(MIGRATE), world.deps, SCOPE, NOW)
    assert world.kinds().count(AuditKind.EVENT) == 1
    assert world.kinds().count(AuditKind.DUPLICATE) == 1


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        as_message({**MIGRATE, "logName": "projects/p/logs/syslog"}),
        as_message({**MIGRATE, "resource": {"type": "gce_instance", "labels": {"project_id": "theirs"}}}),
    ],
)
def test_what_cannot_be_ours_is_acknowledged_and_never_acted_on(
    world: World, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="mbridge.gcp.central"):
        assert handle_log_entry(body, world.deps, SCOPE, NOW) == []
    assert world.kinds() == []
    assert caplog.records, "the reason is logged"


def test_an_automatic_restart_is_passed_by(world: World) -> None:
    restart = json.loads(json.dumps(MIGRATE))
    restart["protoPayload"]["methodName"] = "compute.instances.automaticRestart"
    assert handle_log_entry(as_message(restart), world.deps, SCOPE, NOW) == []
    assert world.kinds() == []


# ---------------------------------------------------------------- over HTTP, through the functions framework


@pytest.fixture(scope="module")
def apps() -> Iterator[dict[str, Any]]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield {
        target: functions_framework.create_app(  # type: ignore[no-untyped-call]  # unannotated in the framework
            target=target, source=str(ROOT / "main.py"), signature_type="cloudevent"
        )
        for target in ("on_central_log_entry", "on_central_tick")
    }
    root.handlers[:], root.level = handlers, level


def test_over_http_the_sinks_entry_and_the_tick_are_acknowledged(
    world: World, apps: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a deployment that trusts the project (the scope is read from its settings)
    monkeypatch.setenv("MBRIDGE_GCP_PROJECT", PROJECT)
    central_entry._scope.cache_clear()
    try:
        headers, body = to_structured(published(as_message(MIGRATE)))
        answer = apps["on_central_log_entry"].test_client().post("/", headers=headers, data=body)
        tick_headers, tick_body = to_structured(published(b"{}"))
        tick = apps["on_central_tick"].test_client().post("/", headers=tick_headers, data=tick_body)
    finally:
        central_entry._scope.cache_clear()

    assert (answer.status_code, tick.status_code) == (200, 200)
    assert world.kinds() == [AuditKind.EVENT, AuditKind.DECISION]


def test_over_http_an_undecodable_message_is_acknowledged(world: World, apps: dict[str, Any]) -> None:
    headers, body = to_structured(published(base64.b64encode(b"x").decode() + "!!"))
    answer = apps["on_central_log_entry"].test_client().post("/", headers=headers, data=body)
    assert answer.status_code == 200
    assert world.kinds() == []
