"""The local function host on the embedded bus: what it does with a message `process` cannot finish."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from functions.core.policy import Policy
from functions.local_app.host import LocalFunctionHost
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.kit import FakeBalancer
from tests.waiting import wait_until
from wire.envelope import encode, envelope_for_event
from wire.errors import PermanentError, RetryableError
from wire.identity import ReporterName
from wire.model import EventKind, MaintenanceEvent
from wire.transports.base import OutboundMessage
from wire.transports.local import LocalBus

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@dataclass
class Host:
    bus: LocalBus
    store: SqliteStore
    balancer: FakeBalancer
    host: LocalFunctionHost

    def publish(self, event: MaintenanceEvent) -> str:
        envelope = envelope_for_event(event, NOW)
        self.bus.publish_event(OutboundMessage(envelope.id, encode(envelope), event.reporter))
        return envelope.id


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Host]:
    bus, store = LocalBus(tmp_path / "bus.db"), SqliteStore(tmp_path / "functions.db")
    balancer = FakeBalancer({"web": ["web-0", "web-1"]})
    yield Host(
        bus, store, balancer, LocalFunctionHost(bus, store, balancer, Policy(), lambda: NOW, verifier=ReporterName())
    )
    bus.close()
    store.close()


def reboot(vm: str, **fields: Any) -> MaintenanceEvent:
    values: dict[str, Any] = {
        "kind": EventKind.REBOOT,
        "event_id": f"E-{vm}",
        "reporter": vm,
        "resources": (vm,),
        "duration_seconds": -1,
        "not_before": NOW + timedelta(minutes=15),
    }
    values.update(fields)
    return azure_event(**values)


@pytest.mark.parametrize(
    "error",
    [PermanentError("not authorised to drain web-0: grant the role"), ValueError("a bug in an adapter")],
    ids=["permanent", "unexpected"],
)
def test_a_message_that_cannot_be_processed_is_dead_lettered_once_and_the_next_goes_on(
    local: Host, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    # GIVEN a message whose drain fails in a way no retry can mend, and a good one behind it
    local.balancer.fail("remove", error, vm="web-0", times=None)
    failed = local.publish(reboot("web-0"))
    local.publish(reboot("web-1"))

    # WHEN the host takes what is on the bus, and looks again
    taken = local.host.step()
    again = local.host.step()

    # THEN the first is set aside with its body and why, logged once, and the second is processed
    assert (taken, again) == (2, 0)
    (letter,) = local.store.dead_letters()
    assert (letter.envelope_id, letter.failed_at) == (failed, NOW)
    assert str(error) in letter.reason
    assert letter.body == encode(envelope_for_event(reboot("web-0"), NOW))
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert failed[:16] in errors[0]
    assert "dead_letters" in errors[0]
    assert local.balancer.drained == ["web-1"]


def test_a_transient_failure_is_still_retried_and_not_dead_lettered(local: Host) -> None:
    # GIVEN a message whose drain times out once
    local.balancer.fail("remove", RetryableError("the load balancer API timed out"), vm="web-0", times=None)
    local.publish(reboot("web-0"))

    # WHEN the host takes it, then again once the API answers
    first = local.host.step()
    local.balancer.heal("remove", "web-0")
    second = local.host.step()

    # THEN it stays on the bus for the next step, and is processed then
    assert (first, second) == (0, 1)
    assert local.store.dead_letters() == []
    assert local.balancer.drained == ["web-0"]


def test_the_running_host_outlives_a_message_it_cannot_process(local: Host) -> None:
    # GIVEN a running host
    stop = threading.Event()
    runner = threading.Thread(target=local.host.run, args=(stop,), daemon=True)
    runner.start()
    try:
        # WHEN a message it cannot process arrives, then a good one
        local.balancer.fail("remove", PermanentError("no such backend pool"), vm="web-0", times=None)
        local.publish(reboot("web-0"))
        local.publish(reboot("web-1"))

        # THEN it goes on to the good one, and keeps running
        wait_until(lambda: local.balancer.drained == ["web-1"], 10, "the second message drained")
        assert runner.is_alive()
    finally:
        stop.set()
        runner.join(timeout=10)
    assert [letter.envelope_id for letter in local.store.dead_letters()] == [
        envelope_for_event(reboot("web-0"), NOW).id
    ]
