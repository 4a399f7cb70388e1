"""The functions' log lines can be queried by event: `process` passes the event, VM, envelope and
command as structured fields, and each app's formatter puts them where its log store indexes
them (Cloud Logging: top-level keys and labels; Azure: the JSON object the host records as the
message). The records come from functions.core processing a real envelope."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from functions.azure_app.logs import HostJsonHandler
from functions.core.policy import Policy
from functions.core.process import Deps, process
from functions.gcp_app.logging import LABELS_KEY, structured
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.envelope import encode, envelope_for_event
from wire.identity import ReporterName
from wire.model import EventKind, EventStatus

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
EVENT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
EVENT_FIELDS = ("event_id", "cloud", "kind", "status", "vm", "envelope_id")


@pytest.fixture
def store() -> Iterator[SqliteStore]:
    store = SqliteStore(":memory:")
    yield store
    store.close()


def run_reboot(store: SqliteStore, sender: RecordingSender, caplog: pytest.LogCaptureFixture) -> str:
    """web-0 reports a Reboot of itself; the envelope's id."""
    event = azure_event(
        event_id=EVENT_ID,
        kind=EventKind.REBOOT,
        status=EventStatus.SCHEDULED,
        reporter="web-0",
        resources=("web-0",),
        not_before=NOW + timedelta(minutes=15),
    )
    envelope = envelope_for_event(event, NOW)
    deps = Deps(
        store=store,
        balancer=FakeBalancer({"web": ("web-0", "web-1")}),
        sender=sender,
        audit=store,
        policy=Policy(),
        verifier=ReporterName(),
        monotonic=FakeClock(NOW).monotonic,
    )
    caplog.set_level(logging.INFO, logger="mbridge.functions")
    process(encode(envelope), deps, NOW)
    return envelope.id


def test_each_action_on_an_event_is_logged_with_the_event_vm_and_envelope(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a report of a Reboot, processed by the function core
    sender = RecordingSender()
    envelope_id = run_reboot(store, sender, caplog)

    # WHEN its log records are read
    records = [r for r in caplog.records if getattr(r, "event_id", None) == EVENT_ID]

    # THEN the drain and the approval each have a record whose fields say what it is about
    by_action = {getattr(r, "action", None): r for r in records}
    assert {"drain", "approve"} <= set(by_action), [r.getMessage() for r in records]
    for record in by_action.values():
        assert {key: getattr(record, key, None) for key in EVENT_FIELDS} == {
            "event_id": EVENT_ID,
            "cloud": "azure",
            "kind": "reboot",
            "status": "scheduled",
            "vm": "web-0",
            "envelope_id": envelope_id,
        }
    # ... and the approval names the command the agent will answer, as it went out
    (command,) = sender.commands
    assert getattr(by_action["approve"], "command_id", None) == command.command_id


def test_a_duplicate_is_logged_with_its_event_and_result(store: SqliteStore, caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN a report processed once
    sender = RecordingSender()
    run_reboot(store, sender, caplog)
    caplog.clear()

    # WHEN the bus delivers it again
    envelope_id = run_reboot(store, sender, caplog)

    # THEN the line of the duplicate can be found by its event and says what it came to
    (record,) = [r for r in caplog.records if getattr(r, "result", None) == "duplicate"]
    assert (getattr(record, "event_id", None), getattr(record, "envelope_id", None)) == (EVENT_ID, envelope_id)


def test_cloud_logging_gets_the_fields_as_top_level_keys_and_indexed_labels(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN the approval's record from a real run
    run_reboot(store, RecordingSender(), caplog)
    record = next(r for r in caplog.records if getattr(r, "action", None) == "approve")

    # WHEN the GCP app writes it as its JSON line
    line = json.loads(json.dumps(structured(record), default=str))

    # THEN every field is a top-level key (jsonPayload.event_id) and a label (labels.event_id)
    for key in (*EVENT_FIELDS, "command_id"):
        assert line[key] == getattr(record, key), key
        assert line[LABELS_KEY][key] == str(getattr(record, key)), key
    assert line["severity"] == "INFO"


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_azure_host_records_a_json_message_holding_the_fields(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN the approval's record from a real run, and a handler standing for the Functions host's
    # one on the root logger (which records the formatted message only, not `extra`)
    run_reboot(store, RecordingSender(), caplog)
    record = next(r for r in caplog.records if getattr(r, "action", None) == "approve")
    host = Kept()
    logging.getLogger().addHandler(host)
    try:
        # WHEN the Azure app's handler passes it on
        HostJsonHandler().handle(record)
    finally:
        logging.getLogger().removeHandler(host)

    # THEN the host gets one record whose message is a JSON object with the fields
    (passed,) = host.records
    message = json.loads(passed.getMessage())
    for key in (*EVENT_FIELDS, "command_id"):
        assert message[key] == getattr(record, key), key
    assert message["message"] == record.getMessage()
    assert (passed.name, passed.levelno) == (record.name, record.levelno)


def test_the_azure_message_keeps_a_traceback_inside_the_json() -> None:
    # GIVEN a record with an exception
    try:
        raise RuntimeError("load balancer said no")
    except RuntimeError:
        record = logging.getLogger("mbridge.functions").makeRecord(
            "mbridge.functions", logging.ERROR, __file__, 1, "failed", (), exc_info=sys.exc_info()
        )
    host = Kept()
    logging.getLogger().addHandler(host)
    try:
        HostJsonHandler().handle(record)
    finally:
        logging.getLogger().removeHandler(host)

    # WHEN the host formats it as it formats every record THEN the message is still one JSON object
    (passed,) = host.records
    text = logging.Formatter().format(passed)
    assert "load balancer said no" in json.loads(text)["exception"]
