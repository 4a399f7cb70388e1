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
    SWEEP_FUNCTION,
    SWEEP_SCHEDULE,
    central_bp,
    handle_central,
)
from functions.azure_app.settings import Settings, SettingsError
from functions.central.event_grid import AzureScope
from functions.core.central import WATCH_LINE
from functions.core.policy import Policy
from functions.core.process import Deps
from functions.local_app.store import SqliteStore
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from tests.unit.azure.test_blueprint import MINIMAL, SUBSCRIPTION
from tests.unit.azure.test_central_events import EVENT_GRID_SCHEMA

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


def test_the_central_functions_are_a_queue_trigger_and_a_timer_each_minute() -> None:
    app = func.FunctionApp()
    app.register_functions(central_bp)

    functions = {f.get_function_name(): json.loads(f.get_function_json())["bindings"] for f in app.get_functions()}

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
