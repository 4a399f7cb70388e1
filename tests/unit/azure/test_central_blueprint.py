"""The control plane's path on Azure Functions (functions/azure_app/central_blueprint.py): its two
functions as the host indexes them, a delivered Event Grid message acted on through the core, and
the setting it needs.

The events are Microsoft's published example (tests/unit/azure/test_central_events.py), in this
deployment's subscription and resource group; the ports are the SQLite store and the kit's fakes.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import azure.functions as func
import pytest

from functions.azure_app import settings as names
from functions.azure_app.central_blueprint import (
    CENTRAL_FUNCTION,
    RECONCILE_FUNCTION,
    RECONCILE_SCHEDULE,
    SWEEP_FUNCTION,
    SWEEP_SCHEDULE,
    blueprints,
    handle_central,
)
from functions.azure_app.settings import Settings, SettingsError, central_functions
from functions.central.event_grid import AzureScope
from functions.central.resource_graph import reconcile
from functions.core.central import WATCH_LINE
from functions.core.policy import Policy
from functions.core.ports import AuditKind, Result
from functions.core.process import Deps
from functions.local_app.store import SqliteStore
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from tests.unit.azure.test_blueprint import MINIMAL, SUBSCRIPTION
from tests.unit.azure.test_central_events import EVENT_GRID_SCHEMA
from tests.unit.functions.test_central_reconcile import Table

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
SCOPE = AzureScope(subscriptions=(SUBSCRIPTION,), resource_groups=("rg-web",))


def scheduled(vm: str = "web-0", group: str = "rg-web") -> dict[str, Any]:
    """Microsoft's example event, moved into `group` of this deployment's subscription, Scheduled for `vm`."""
    event = copy.deepcopy(EVENT_GRID_SCHEMA)
    info = event["data"]["resourceInfo"]
    info["id"] = (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/{vm}"
    )
    info["properties"].update(EventStatus="Scheduled", EventType="Reboot", Resources=[vm], DurationInSeconds=-1)
    return event


@pytest.fixture
def deps() -> Iterator[Deps]:
    store = SqliteStore(":memory:")
    yield Deps(
        store,
        FakeBalancer({"web": ("web-0", "web-1")}),
        RecordingSender(),
        store,
        Policy(),
        monotonic=FakeClock().monotonic,
    )
    store.close()


def registered(queue: bool, reconcile: bool) -> dict[str, Any]:
    """The functions the host indexes with these settings: each one's bindings, by name."""
    app = func.FunctionApp()
    for blueprint in blueprints(queue, reconcile):
        app.register_functions(blueprint)
    return {str(f.get_function_name()): json.loads(f.get_function_json())["bindings"] for f in app.get_functions()}


def test_the_central_functions_are_a_queue_trigger_and_a_timer_each_minute() -> None:
    functions = registered(queue=True, reconcile=False)

    assert functions[CENTRAL_FUNCTION] == [
        {
            "direction": "IN",
            "type": "serviceBusTrigger",
            "name": "msg",
            "connection": "MBRIDGE_SERVICEBUS",
            "queueName": "%MBRIDGE_CENTRAL_QUEUE%",
        }
    ]
    (timer,) = functions[SWEEP_FUNCTION]
    assert (timer["type"], timer["schedule"], timer["runOnStartup"]) == ("timerTrigger", SWEEP_SCHEDULE, False)
    assert set(functions) == {CENTRAL_FUNCTION, SWEEP_FUNCTION}


def test_the_reconciliation_is_a_timer_every_five_minutes_registered_with_the_sweep_only_when_on() -> None:
    functions = registered(queue=False, reconcile=True)

    assert set(functions) == {RECONCILE_FUNCTION, SWEEP_FUNCTION}
    (timer,) = functions[RECONCILE_FUNCTION]
    assert (timer["type"], timer["schedule"], timer["runOnStartup"]) == ("timerTrigger", RECONCILE_SCHEDULE, False)
    assert RECONCILE_SCHEDULE == "30 */5 * * * *"
    assert set(registered(queue=True, reconcile=True)) == {CENTRAL_FUNCTION, RECONCILE_FUNCTION, SWEEP_FUNCTION}
    assert registered(queue=False, reconcile=False) == {}


@pytest.mark.parametrize(
    ("environ", "chosen"),
    [
        ({}, (False, False)),
        ({names.CENTRAL_QUEUE: "maintenance-central"}, (True, False)),
        ({names.CENTRAL_RECONCILE: "true"}, (False, True)),
        ({names.CENTRAL_RECONCILE: " On "}, (False, True)),
        ({names.CENTRAL_RECONCILE: "false", names.CENTRAL_QUEUE: " "}, (False, False)),
        ({names.CENTRAL_RECONCILE: "maybe"}, (False, False)),
    ],
)
def test_the_app_registers_each_path_for_its_own_setting(environ: dict[str, str], chosen: tuple[bool, bool]) -> None:
    assert central_functions(environ) == chosen


def test_a_pass_of_the_timer_reads_the_table_through_the_port_and_repeats_nothing(deps: Deps) -> None:
    # GIVEN Resource Graph's table with our web-0's Reboot and a sandbox group's VM of the same name
    table = Table([resource_graph_row(scheduled("web-0")), resource_graph_row(scheduled("web-0", group="sandbox-rg"))])

    # WHEN two passes read it
    first = reconcile(table, deps, SCOPE, NOW)
    audited = len(deps.audit.query())
    second = reconcile(table, deps, SCOPE, NOW)

    # THEN ours is watched once; the second pass writes nothing; the other group's is not acted on
    assert [outcome.result for outcome in first] == [Result.PROCESSED]
    assert [outcome.result for outcome in second] == [Result.DUPLICATE]
    assert [parked.event_key for parked in deps.store.parked(WATCH_LINE)] == [
        "azure:3da1b9aa-5204-4335-8c33-c54e315dcffe|web-0"
    ]
    assert len(deps.audit.query()) == audited
    assert [record.kind for record in deps.audit.query()] == [AuditKind.EVENT, AuditKind.DECISION]
    assert table.asked[0][0] == SCOPE


def resource_graph_row(event: dict[str, Any]) -> dict[str, Any]:
    """The table's row of an Event Grid event: its resourceInfo, with the row's columns."""
    info = event["data"]["resourceInfo"]
    resource = info["id"].split("/")
    return {
        "id": f"{info['id']}/providers/Microsoft.Maintenance/scheduledevents/{info['properties']['EventId']}",
        "name": info["properties"]["EventId"],
        "type": "microsoft.maintenance/scheduledevents",
        "subscriptionId": resource[2],
        "resourceGroup": resource[4],
        "properties": info["properties"],
    }


def test_a_delivered_event_of_ours_is_watched_and_another_groups_is_acknowledged_unacted(deps: Deps) -> None:
    # GIVEN one message with our web-0's Reboot and a sandbox group's VM of the same name
    body = json.dumps([scheduled("web-0"), scheduled("web-0", group="sandbox-rg")]).encode()

    # WHEN it is delivered
    outcomes = handle_central(body, deps, SCOPE, NOW)

    # THEN ours is watched for its agent's report, the other is not acted on at all
    assert [outcome.result for outcome in outcomes] == ["processed"]
    assert [parked.event_key for parked in deps.store.parked(WATCH_LINE)] == [
        "azure:3da1b9aa-5204-4335-8c33-c54e315dcffe|web-0"
    ]


@pytest.mark.parametrize("body", [b"not json", b'"text"', b"[1, 2]"])
def test_a_message_that_is_no_event_is_acknowledged_and_changes_nothing(deps: Deps, body: bytes) -> None:
    assert handle_central(body, deps, SCOPE, NOW) == []
    assert deps.store.parked(WATCH_LINE) == []


def test_the_central_queue_needs_the_subscriptions_it_may_concern() -> None:
    with_queue = {**MINIMAL, names.CENTRAL_QUEUE: "maintenance-central"}
    assert Settings.from_env(with_queue).central_scope == AzureScope(
        subscriptions=(SUBSCRIPTION,), resource_groups=("rg-web",)
    )
    without = {key: value for key, value in with_queue.items() if key != names.TRUST_SUBSCRIPTIONS}
    without[names.POLICY] = json.dumps({"trust": "reporter-name"})
    with pytest.raises(SettingsError, match="MBRIDGE_CENTRAL_QUEUE is set but MBRIDGE_TRUST_SUBSCRIPTIONS is not"):
        Settings.from_env(without)


def test_the_reconciliation_needs_the_subscriptions_it_reads_and_a_flag() -> None:
    assert Settings.from_env(MINIMAL).central_reconcile is False
    assert Settings.from_env({**MINIMAL, names.CENTRAL_RECONCILE: "true"}).central_reconcile is True
    with pytest.raises(SettingsError, match="MBRIDGE_CENTRAL_RECONCILE is true or false, not 'maybe'"):
        Settings.from_env({**MINIMAL, names.CENTRAL_RECONCILE: "maybe"})
    without = {key: value for key, value in MINIMAL.items() if key != names.TRUST_SUBSCRIPTIONS}
    without.update({names.POLICY: json.dumps({"trust": "reporter-name"}), names.CENTRAL_RECONCILE: "yes"})
    with pytest.raises(SettingsError, match="MBRIDGE_CENTRAL_RECONCILE is true but MBRIDGE_TRUST_SUBSCRIPTIONS is not"):
        Settings.from_env(without)
