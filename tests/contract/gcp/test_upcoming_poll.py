"""The tick of the control plane's path reads the instances' upcoming maintenance through the real
Compute client (REST) from the stand-in of tests/contract/gcp/test_compute.py: each notice acted on
once, the next ticks quiet, another project's instances never listed, a refused listing still swept.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import pytest
from google.cloud import compute_v1

from functions.central.gce_upcoming import GceScope
from functions.core.central import WATCH_LINE
from functions.core.policy import Policy
from functions.core.ports import AuditKind
from functions.core.process import Deps
from functions.gcp_app.central_entry import handle_tick
from functions.gcp_app.upcoming import ComputeUpcoming
from functions.local_app.store import SqliteStore
from tests.contract.gcp.test_compute import PROJECT, ZONE_B, Fixture
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from tests.unit.gcp.test_entry import NOW
from wire.errors import PermanentError
from wire.identity import ReporterName

WINDOW = {
    "canReschedule": True,
    "maintenanceStatus": "PENDING",
    "type": "SCHEDULED",
    "windowStartTime": "2026-03-02T19:00:00Z",
    "windowEndTime": "2026-03-02T22:00:00Z",
}


@pytest.fixture
def store() -> Iterator[SqliteStore]:
    made = SqliteStore(":memory:")
    yield made
    made.close()


def deps_on(store: SqliteStore) -> Deps:
    return Deps(
        store=store,
        balancer=FakeBalancer({"web": ["web-0", "web-1"]}),
        sender=RecordingSender(),
        audit=store,
        policy=replace(Policy(), silent_agents="drain"),
        verifier=ReporterName(),
        monotonic=FakeClock().monotonic,
    )


def upcoming(compute: Fixture) -> ComputeUpcoming:
    return ComputeUpcoming(compute_v1.InstancesClient(**compute.options()), timeout=10.0)


def test_each_notice_is_acted_on_once_and_the_next_ticks_write_nothing(compute: Fixture, store: SqliteStore) -> None:
    # GIVEN two instances of ours, one with maintenance upcoming, and another project's with one too
    compute.api.given(ZONE_B, "web-0", "1001")
    compute.api.given(ZONE_B, "web-1", "1002")
    compute.api.given(ZONE_B, "web-1", "2002", project="their-project")
    compute.api.upcoming[(PROJECT, ZONE_B, "web-1")] = WINDOW
    compute.api.upcoming[("their-project", ZONE_B, "web-1")] = WINDOW
    deps, scope = deps_on(store), GceScope(projects=(PROJECT,))

    # WHEN the scheduler ticks three times
    handle_tick(deps, NOW, upcoming(compute), scope)
    records = len(store.query())
    handle_tick(deps, NOW + timedelta(seconds=1), upcoming(compute), scope)
    handle_tick(deps, NOW + timedelta(seconds=2), upcoming(compute), scope)

    # THEN web-1's notice was taken once, is watched, and the later ticks wrote nothing
    (event,) = [record for record in store.query() if record.kind == AuditKind.EVENT]
    assert (event.vm, event.detail["sender"]) == (
        "web-1",
        f"control plane: gce-upcoming as projects/{PROJECT}/zones/{ZONE_B}/instances/web-1 (id 1002)",
    )
    assert len(store.query()) == records
    assert len(list(store.parked(WATCH_LINE))) == 1
    # and only the deployment's project was listed
    listed = {request.path for request in compute.api.requests}
    assert listed == {f"/compute/v1/projects/{PROJECT}/aggregated/instances"}


def test_a_listing_refused_is_named_and_the_sweep_still_runs(
    compute: Fixture, store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a watched notice past its bound, and a tick whose listing is refused (no compute.instances.list)
    compute.api.given(ZONE_B, "web-1", "1002")
    compute.api.upcoming[(PROJECT, ZONE_B, "web-1")] = WINDOW
    deps, scope = deps_on(store), GceScope(projects=(PROJECT,))
    handle_tick(deps, NOW, upcoming(compute), scope)
    compute.api.fail["aggregated/instances"] = [(403, "forbidden")]

    # WHEN the tick comes after the bound
    later = NOW + timedelta(seconds=deps.policy.silent_agent_seconds)
    found = handle_tick(deps, later, upcoming(compute), scope)

    # THEN the refusal is logged with what is missing, and the silent agent still found
    assert len(found) == 1
    assert any("compute.instances.list" in record.getMessage() for record in caplog.records)


def test_a_refused_listing_is_a_permanent_error_naming_the_permission(compute: Fixture) -> None:
    compute.api.fail["aggregated/instances"] = [(403, "forbidden")]
    with pytest.raises(PermanentError, match=r"compute\.instances\.list"):
        list(upcoming(compute).instances(GceScope(projects=(PROJECT,))))
