"""The function as the push subscription `maintenance-events-functions` calls it.

infra/terraform/gcp/ feeds the function through its own push subscription instead of an Eventarc
trigger (Eventarc's subscription cannot carry a dead-letter policy in Terraform). Pub/Sub then
POSTs its raw push body, with no CloudEvent headers:

    {"message": {"data": <base64>, "messageId": ..., "attributes": {...}}, "subscription": ...}

to the push endpoint `<function URI>/projects/P/topics/maintenance-events`. The functions
framework converts that body into the messagePublished CloudEvent the entry point takes. These
tests run the real framework (`create_app(...).test_client()`) on main.py with in-memory fakes of
our ports set through `wiring.override`, and check that the envelope reaches the core and that
the HTTP answers are what Pub/Sub's retry and dead-lettering need.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import functions_framework
import pytest

from functions.core.policy import Policy
from functions.core.process import Deps
from functions.gcp_app import wiring
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.envelope import encode, envelope_for_event
from wire.errors import RetryableError
from wire.identity import ReporterName
from wire.model import Cloud, EventKind, EventSource, EventStatus, MaintenanceEvent

ROOT = Path(__file__).resolve().parents[3]
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
PROJECT = "shop-prod"
TOPIC = f"projects/{PROJECT}/topics/maintenance-events"
SUBSCRIPTION = f"projects/{PROJECT}/subscriptions/maintenance-events-functions"


# ---------------------------------------------------------------- the app over fakes of our ports


@dataclass
class World:
    store: SqliteStore
    balancer: FakeBalancer
    sender: RecordingSender

    def kinds(self) -> list[str]:
        return [record.kind for record in self.store.query()]


@pytest.fixture
def world() -> Iterator[World]:
    store = SqliteStore(":memory:")
    balancer, sender = FakeBalancer({"web-b": ["web-0"]}), RecordingSender()
    # A live migration drains and never restores: a restore here would be a bug of the core.
    balancer.fail("restore", AssertionError("nothing here restores"), times=None)
    deps = Deps(
        store=store,
        balancer=balancer,
        sender=sender,
        audit=store,
        policy=Policy(),
        verifier=ReporterName(),
        monotonic=FakeClock().monotonic,
    )
    with wiring.override(deps):
        yield World(store, balancer, sender)
    store.close()


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    app = functions_framework.create_app(  # type: ignore[no-untyped-call]  # the framework leaves it unannotated
        target="on_maintenance_event", source=str(ROOT / "main.py"), signature_type="cloudevent"
    )
    yield app.test_client()
    root.handlers[:], root.level = handlers, level


# ---------------------------------------------------------------- what Pub/Sub sends


def live_migration() -> MaintenanceEvent:
    return azure_event(
        cloud=Cloud.GCE,
        kind=EventKind.LIVE_MIGRATE,
        status=EventStatus.SCHEDULED,
        event_id="6f1c0d7e54b3a2918d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2918d7c6b5a4f3e2",
        reporter="web-0",
        resources=("web-0",),
        sequence="etag-1",
        not_before=NOW + timedelta(seconds=60),
        duration_seconds=None,
        event_source=EventSource.PLATFORM,
        description="",
        raw={"maintenance-event": "MIGRATE_ON_HOST_MAINTENANCE"},
    )


def push_body(data: bytes | str, message_id: str = "1") -> dict[str, Any]:
    """Pub/Sub's push request body for one message (bytes are base64-encoded here)."""
    encoded = base64.b64encode(data).decode() if isinstance(data, bytes) else data
    return {
        "message": {
            "data": encoded,
            "messageId": message_id,
            "message_id": message_id,
            "publishTime": "2026-03-01T12:00:00.481Z",
            "publish_time": "2026-03-01T12:00:00.481Z",
            "orderingKey": "web-0",
            "attributes": {"type": "org.maintenancebridge.maintenance.scheduled", "vm": "web-0", "cloud": "gce"},
        },
        "subscription": SUBSCRIPTION,
    }


def push(client: Any, body: dict[str, Any], path: str = f"/{TOPIC}") -> Any:
    # Only what Pub/Sub sends: a JSON body, no ce-* headers and no CloudEvents content type.
    return client.post(path, data=json.dumps(body), headers={"Content-Type": "application/json"})


def envelope_bytes(event: MaintenanceEvent) -> bytes:
    return encode(envelope_for_event(event, NOW))


# ---------------------------------------------------------------- the tests


def test_a_raw_push_body_reaches_the_core_and_is_acknowledged(world: World, client: Any) -> None:
    # GIVEN a scheduled live migration of web-0, as the agent publishes it
    # WHEN Pub/Sub pushes the raw message body to the function's push endpoint
    response = push(client, push_body(envelope_bytes(live_migration())))
    # THEN the answer is 2xx (Pub/Sub acknowledges) and the event was acted on: drained, audited
    assert response.status_code == 200
    assert world.balancer.drained == ["web-0"]
    assert world.kinds()[:2] == ["event", "decision"]
    assert world.sender.commands == []  # GCE has no approval to send; the fake balancer sends no drain command


def test_the_push_endpoint_without_the_topic_path_works_too(world: World, client: Any) -> None:
    # GIVEN a push subscription whose endpoint is the bare function URI
    response = push(client, push_body(envelope_bytes(live_migration())), path="/")
    # THEN the message is handled just the same
    assert response.status_code == 200
    assert world.balancer.drained == ["web-0"]


def test_a_redelivered_push_is_acknowledged_without_acting_again(world: World, client: Any) -> None:
    # GIVEN a message pushed once and handled
    first = push(client, push_body(envelope_bytes(live_migration()), message_id="1"))
    # WHEN Pub/Sub pushes it again (ack lost, or another VM's report of the same event)
    second = push(client, push_body(envelope_bytes(live_migration()), message_id="2"))
    # THEN both are acknowledged and the VM was drained once
    assert (first.status_code, second.status_code) == (200, 200)
    assert world.balancer.drained == ["web-0"]
    assert world.kinds()[-1] == "duplicate"


def test_a_failure_answers_an_error_so_pubsub_retries_and_dead_letters(world: World, client: Any) -> None:
    # GIVEN the instance-group API failing for now
    world.balancer.fail("remove", RetryableError("the instance groups API timed out"), times=None)
    # WHEN the message is pushed
    response = push(client, push_body(envelope_bytes(live_migration())))
    # THEN the answer is not 2xx: Pub/Sub redelivers with backoff, then dead-letters
    assert response.status_code == 500


def test_the_topic_in_the_push_path_names_the_event_source(
    world: World, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a message whose data is not base64 (nothing to act on, logged with the event's source)
    response = push(client, push_body("this is not base64 ***"))
    # THEN it is acknowledged, and the log names the topic the push path carried
    assert response.status_code == 200
    errors = [record.getMessage() for record in caplog.records if record.levelname == "ERROR"]
    assert any(f"source //pubsub.googleapis.com/{TOPIC}" in message for message in errors), errors
    assert world.kinds() == []
