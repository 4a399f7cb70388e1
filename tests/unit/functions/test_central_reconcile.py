"""The reconciliation with Azure Resource Graph (functions/central/resource_graph.py): every row of the
`maintenanceresources` table acted on once per step however often it is read, quietly on the passes
that find nothing new, and a step the agent or Event Grid already brought going through without
acting twice.

The rows come from an in-memory table (`Table`, a `ResourceGraphRows`); the world is the one of
tests/unit/functions/test_central.py: the agents' reports through `process`, the SQLite store and pool.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from functions.central.event_grid import AzureScope
from functions.central.resource_graph import ROWS_MOST, reconcile
from functions.core.central import EVENT_GRID, RESOURCE_GRAPH, WATCH_LINE
from functions.core.ports import ActionName, AuditKind, Result
from tests.unit.functions.test_central import EVENT_ID, SET, SILENT_AFTER, START, World
from tests.unit.functions.test_trust import opened
from wire.model import EventStatus

SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"
SCOPE = AzureScope(subscriptions=(SUBSCRIPTION,), resource_groups=("rg-web",))
NOT_BEFORE = "Sun, 01 Mar 2026 12:15:00 GMT"  # START + 15 minutes


def row(status: EventStatus, vms: tuple[str, ...] = ("web-0",), group: str = "rg-web") -> dict[str, Any]:
    """The table's row of the Reboot in `status`, raised on the first VM it names."""
    vm_id = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/{vms[0]}"
    return {
        "id": f"{vm_id}/providers/Microsoft.Maintenance/scheduledevents/{EVENT_ID}",
        "name": EVENT_ID,
        "type": "microsoft.maintenance/scheduledevents",
        "tenantId": "00000000-0000-0000-0000-00000000000a",
        "location": "westeurope",
        "resourceGroup": group,
        "subscriptionId": SUBSCRIPTION,
        "properties": {
            "DurationInSeconds": -1,
            "Description": "Host server is undergoing maintenance.",
            "EventId": EVENT_ID,
            "EventSource": "Platform",
            "EventStatus": status.value.capitalize(),
            "EventType": "Reboot",
            "NotBefore": NOT_BEFORE if status is EventStatus.SCHEDULED else "",
            "Resources": list(vms),
            "ResourceType": "VirtualMachine",
        },
        "zones": [],
    }


@dataclass
class Table:
    """Resource Graph's table as the port reads it: the rows as they stand, the passes that asked."""

    rows_now: list[Mapping[str, Any]] = field(default_factory=list)
    asked: list[tuple[AzureScope, int]] = field(default_factory=list)

    def rows(self, scope: AzureScope, most: int) -> list[Mapping[str, Any]]:
        self.asked.append((scope, most))
        return list(self.rows_now[:most])


@dataclass
class ReconciledWorld(World):
    table: Table = field(default_factory=Table)

    def reconcile(self) -> list[Result]:
        outcomes = reconcile(self.table, self.deps(), SCOPE, self.clock.now())
        self.outcomes += outcomes
        return [outcome.result for outcome in outcomes]

    def from_graph(self) -> list[str]:
        """The VMs of the steps the table reported, as the audit log records them."""
        return [
            record.vm
            for record in self.store.query()
            if record.kind == AuditKind.EVENT
            and str(record.detail.get("sender", "")).startswith(f"control plane: {RESOURCE_GRAPH}")
        ]


@pytest.fixture
def world() -> Iterator[ReconciledWorld]:
    with opened(ReconciledWorld, SET) as made:
        yield made


def test_a_pass_acts_on_a_row_once_and_the_passes_after_it_write_nothing(world: ReconciledWorld) -> None:
    # GIVEN the table holds web-1's Scheduled Reboot, which Event Grid never delivered
    world.table.rows_now = [row(EventStatus.SCHEDULED, vms=("web-1",))]

    # WHEN the reconciliation passes, and passes again five minutes later
    first = world.reconcile()
    audited = len(world.store.query())
    world.clock.advance(300)
    second = world.reconcile()

    # THEN the first pass watched web-1 for its agent's report, on the table's word
    assert first == [Result.PROCESSED]
    assert [parked.event_key for parked in world.store.parked(WATCH_LINE)] == [f"azure:{EVENT_ID.lower()}|web-1"]
    assert (audited, world.from_graph()) == (2, ["web-1"])
    # ... and the second found it already seen: no audit record, nothing moved
    assert second == [Result.DUPLICATE]
    assert len(world.store.query()) == audited
    assert world.table.asked == [(SCOPE, ROWS_MOST)] * 2


def test_a_completion_event_grid_lost_is_found_in_the_table_and_puts_the_vm_back_once(world: ReconciledWorld) -> None:
    # GIVEN web-0 drained and approved on its agent's report, the agent dead since, and Event Grid's
    # Completed lost: only the table has it
    world.agent(EventStatus.SCHEDULED)
    world.centre(EventStatus.SCHEDULED)
    assert "web-0" not in world.pool.members("web")
    world.clock.advance(600)
    world.table.rows_now = [row(EventStatus.COMPLETED)]

    # WHEN the reconciliation passes three times
    written = []
    for _ in range(3):
        before = len(world.store.query())
        world.reconcile()
        written.append([record.kind for record in world.store.query()[before:]])
        world.clock.advance(300)

    # THEN web-0 is back once, and only the first pass wrote anything: the table's step, the restore
    assert sorted(world.pool.members("web")) == list(SET)
    assert world.taken(ActionName.RESTORE) == ["web-0"]
    assert written == [[AuditKind.EVENT, AuditKind.DECISION, AuditKind.ACTION], [], []]


def test_rows_of_steps_the_agent_and_event_grid_took_go_through_and_never_act_twice(world: ReconciledWorld) -> None:
    # GIVEN web-0's Reboot reported Scheduled and Completed by its agent and by Event Grid, each
    # step acted on once: drained, approved, put back
    world.table.rows_now = [row(EventStatus.SCHEDULED)]
    world.agent(EventStatus.SCHEDULED)
    world.centre(EventStatus.SCHEDULED, EVENT_GRID)
    world.reconcile()  # the table's Scheduled, read before the event ended
    world.clock.advance(300)
    world.agent(EventStatus.COMPLETED)
    world.centre(EventStatus.COMPLETED, EVENT_GRID)
    world.table.rows_now = [row(EventStatus.COMPLETED)]  # updated in place, as Azure's table is

    # WHEN the reconciliation passes twice more, and the sweep runs long after
    world.reconcile()
    world.clock.advance(300)
    world.reconcile()
    world.clock.advance(SILENT_AFTER * 10)
    world.sweep()

    # THEN each of the table's steps went through once (the claim is per feed) ...
    assert world.from_graph() == ["web-0", "web-0"]
    # ... and nothing was done twice: one drain, one approval, one restore, one end recorded
    assert world.taken(ActionName.DRAIN) == ["web-0"]
    assert world.approvals() == ["web-0"]
    assert world.taken(ActionName.RESTORE) == ["web-0"]
    assert sorted(world.pool.members("web")) == list(SET)
    assert world.audited(AuditKind.AGENT_SILENT) == []
    assert world.store.parked(WATCH_LINE) == []


def test_a_row_that_is_not_ours_is_logged_and_the_rest_of_the_pass_goes_on(
    world: ReconciledWorld, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a sandbox group's VM named like ours, a row of another type, and our web-2's Scheduled
    world.table.rows_now = [
        row(EventStatus.SCHEDULED, group="sandbox-rg"),
        {**row(EventStatus.SCHEDULED), "type": "microsoft.maintenance/applyupdates"},
        row(EventStatus.SCHEDULED, vms=("web-2",)),
    ]

    # WHEN the reconciliation passes
    with caplog.at_level(logging.INFO, logger="mbridge.functions.central.polling"):
        results = world.reconcile()

    # THEN web-2 alone is watched, and the two others are named in the log, with why
    assert results == [Result.PROCESSED]
    assert [parked.event_key for parked in world.store.parked(WATCH_LINE)] == [f"azure:{EVENT_ID.lower()}|web-2"]
    refused = [record.getMessage() for record in caplog.records if "not acted on" in record.getMessage()]
    assert len(refused) == 2
    assert "not in this deployment's scope" in refused[0]
    assert "not a scheduled event" in refused[1]
    assert world.clock.now() == START
