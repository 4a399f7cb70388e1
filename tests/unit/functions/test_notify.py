"""Notices of audit records (functions/core/notify.py): the template, the filter, and announcing
from `process` without ever holding up or failing an action."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from functions.core.notify import (
    DEFAULT_TEMPLATE,
    PLACEHOLDERS,
    Notice,
    NoticeFilter,
    NotifyingAuditLog,
    TemplateError,
    WebhookTemplate,
    digest_notice,
    notice_values,
)
from functions.core.policy import Policy
from functions.core.ports import AuditRecord
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.envelope import encode, envelope_for_command_result, envelope_for_event
from wire.identity import ReporterName
from wire.model import Cloud, CommandResult, EventKind, EventStatus, MaintenanceEvent

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@dataclass
class Notices:
    """A Notifier that keeps what it is given (the webhook adapter is tested in test_notify_webhook.py)."""

    notices: list[Notice] = field(default_factory=list)
    fail: bool = False

    def notify(self, notice: Notice) -> None:
        if self.fail:
            raise RuntimeError("the notifier is broken")
        self.notices.append(notice)

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(notice.body) for notice in self.notices]


@dataclass
class World:
    store: SqliteStore
    pool: FakeBalancer
    sent: RecordingSender
    notifier: Notices

    def run(self, event: MaintenanceEvent, notice_filter: str | None = None, template: str | None = None) -> Any:
        audit = NotifyingAuditLog(
            self.store, self.notifier, WebhookTemplate.parse(template), NoticeFilter.parse(notice_filter)
        )
        deps = Deps(
            store=self.store,
            balancer=self.pool,
            sender=self.sent,
            audit=audit,
            policy=Policy(),
            monotonic=FakeClock(NOW).monotonic,
            verifier=ReporterName(),
        )
        return process(encode(envelope_for_event(event, NOW)), deps, NOW)


@pytest.fixture
def world() -> Iterator[World]:
    store = SqliteStore(":memory:")
    yield World(store, FakeBalancer({"web": ("web-0", "web-1")}), RecordingSender(), Notices())
    store.close()


def reboot(status: EventStatus, **fields: Any) -> MaintenanceEvent:
    values: dict[str, Any] = {
        "kind": EventKind.REBOOT,
        "status": status,
        "reporter": "web-0",
        "resources": ("web-0",),
        "not_before": NOW + timedelta(minutes=15),
        "event_id": "E-REBOOT",
    }
    values.update(fields)
    return azure_event(**values)


# ---------------------------------------------------------------- the template


def test_values_are_inserted_json_escaped_whatever_they_hold() -> None:
    # GIVEN a template with two placeholders, and values with quotes, backslashes, newlines and braces
    template = WebhookTemplate.parse('{"text": "VM ${vm}: ${reason}", "id": "${event_id}"}')
    vm, reason = 'web-"0"\\', 'line one\nline two\t"}, "injected": "yes'
    # WHEN it is rendered
    body = json.loads(template.render({"vm": vm, "reason": reason, "event_id": "E-1"}))
    # THEN the body is valid JSON holding the values exactly, and nothing was added to it
    assert body == {"text": f"VM {vm}: {reason}", "id": "E-1"}


def test_the_default_template_is_a_text_field_slack_and_teams_connectors_post() -> None:
    template = WebhookTemplate.parse(None)
    assert template.text == DEFAULT_TEMPLATE
    assert json.loads(template.render({"summary": "a\nb"})) == {"text": "a\nb"}
    assert WebhookTemplate.parse("   ").text == DEFAULT_TEMPLATE


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ('{"text": "${nope}"}', r"unknown placeholder \$\{nope\} at character 11; known: action, at, cloud"),
        ('{"text": "${vm"', "not closed"),
        ('{"text": ${summary}}', "does not render to valid JSON .*inside a JSON string"),
        ('{"text": "\\${vm}"}', "follows a backslash"),
        ('["${summary}"]', "renders to a JSON list, not an object"),
        ('{"text": "${summary}"', "does not render to valid JSON"),
        ("x" * 20_000, "at most 16384"),
    ],
)
def test_a_template_that_cannot_be_used_is_refused_when_read(template: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        WebhookTemplate.parse(template)


def test_a_doubled_dollar_is_a_literal_dollar() -> None:
    template = WebhookTemplate.parse('{"text": "$$${vm} costs $$5"}')
    assert json.loads(template.render({"vm": "web-0"})) == {"text": "$web-0 costs $5"}
    assert template.names == ("vm",)


def test_every_placeholder_has_a_value_for_every_record() -> None:
    # GIVEN a template using every placeholder
    text = json.dumps({name: f"${{{name}}}" for name in PLACEHOLDERS})
    template = WebhookTemplate.parse(text)
    record = AuditRecord(
        time=NOW,
        kind="action",
        envelope_id="env",
        event_id="E-1",
        vm="web-0",
        action="approve",
        status="scheduled",
        rule="5-platform",
        reason="drained; approved after the drain period",
        at=NOW + timedelta(seconds=30),
        detail={"kind": "reboot", "cloud": "azure"},
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
    )
    # WHEN an approval is rendered
    body = json.loads(template.render(notice_values(record)))
    # THEN each placeholder says what the docs say it holds
    assert body["result"] == "done"
    assert body["event_kind"] == "reboot"
    assert body["cloud"] == "azure"
    assert body["time"] == "2026-03-01T12:00:00Z"
    assert body["at"] == "2026-03-01T12:00:30Z"
    assert body["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert body["summary"] == (
        "[maintenance-bridge] web-0: reboot E-1 approved, to start at 2026-03-01T12:00:30Z: "
        "drained; approved after the drain period"
    )


def test_the_trace_id_of_a_record_without_one_or_of_a_digest_is_empty() -> None:
    # GIVEN a template with the trace id, and a record of no trace (written before traces were kept)
    template = WebhookTemplate.parse('{"text": "${summary}", "trace": "${trace_id}"}')
    record = AuditRecord(time=NOW, kind="decision", envelope_id="env", event_id="E-1", vm="web-0", rule="5-platform")
    traced = AuditRecord(
        time=NOW, kind="action", envelope_id="env", event_id="E-2", vm="web-1", action="drain", trace_id="ab" * 16
    )
    # WHEN it is rendered, and a digest of it and a traced one
    alone = json.loads(template.render(notice_values(record)))
    notices = [
        Notice(r.event_id, r.vm, r.kind, r.action, "{}", line=notice_values(r)["summary"]) for r in (record, traced)
    ]
    digest = json.loads(digest_notice(notices, template).body)
    # THEN the trace id is empty: the record has none, and a digest is of several traces
    assert alone["trace"] == ""
    assert digest["trace"] == ""
    assert json.loads(template.render(notice_values(traced)))["trace"] == "ab" * 16


# ---------------------------------------------------------------- the filter


def test_by_default_decisions_and_actions_are_announced_not_the_report_itself(world: World) -> None:
    # GIVEN a platform Reboot of web-0, scheduled, then completed
    world.run(reboot(EventStatus.SCHEDULED))
    world.run(reboot(EventStatus.COMPLETED))
    # THEN the decisions, the drain, the approval and the restore were announced, in that order,
    # and neither the reports nor the `none` of the ended step
    assert [(n.kind, n.action) for n in world.notifier.notices] == [
        ("decision", ""),
        ("action", "drain"),
        ("action", "approve"),
        ("decision", ""),
        ("action", "restore"),
    ]
    texts = [body["text"] for body in world.notifier.bodies()]
    assert texts[1].startswith("[maintenance-bridge] web-0 taken out of its pools for reboot E-REBOOT (scheduled)")
    assert texts[4].startswith("[maintenance-bridge] web-0 put back after reboot E-REBOOT (completed)")
    # AND the audit log holds every record, announced or not
    assert [line.kind for line in world.store.query()].count("event") == 2


def test_a_filter_names_kinds_actions_and_command_answers(world: World) -> None:
    # GIVEN a filter for approvals and rejected commands only
    world.run(reboot(EventStatus.SCHEDULED), notice_filter="approve, REJECTED")
    assert [(n.kind, n.action) for n in world.notifier.notices] == [("action", "approve")]
    # WHEN the agent answers one command accepted and another rejected
    for accepted in (True, False):
        answer = CommandResult(f"cmd-{accepted}", accepted, "E-REBOOT", "web-0", "" if accepted else "not scheduled")
        body = encode(envelope_for_command_result(answer, Cloud.AZURE, NOW))
        deps = Deps(
            store=world.store,
            balancer=world.pool,
            sender=world.sent,
            audit=NotifyingAuditLog(world.store, world.notifier, notice_filter=NoticeFilter.parse("approve,rejected")),
            policy=Policy(),
            verifier=ReporterName(),
            monotonic=FakeClock(NOW).monotonic,
        )
        process(body, deps, NOW)
    # THEN only the rejection was announced besides the approval
    assert [(n.kind, n.action) for n in world.notifier.notices][1:] == [("command-result", "rejected")]
    assert "web-0 rejected the command for event E-REBOOT: not scheduled" in world.notifier.bodies()[1]["text"]


def test_all_announces_every_record(world: World) -> None:
    world.run(reboot(EventStatus.SCHEDULED), notice_filter="all")
    assert [n.kind for n in world.notifier.notices] == ["event", "decision", "action", "action"]


def test_an_unknown_filter_name_is_refused() -> None:
    with pytest.raises(ValueError, match="'drained' is not an audit kind or action; known: all, event, decision"):
        NoticeFilter.parse("decision, drained")


# ---------------------------------------------------------------- never in the way


def test_a_notifier_that_fails_neither_fails_nor_changes_the_action(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a notifier that raises on every notice
    world.notifier.fail = True
    # WHEN a Reboot is processed
    with caplog.at_level(logging.ERROR, logger="mbridge.functions.notify"):
        outcome = world.run(reboot(EventStatus.SCHEDULED))
    # THEN the VM was drained and approved, the audit log is whole, and the failure was logged
    assert outcome.result == "processed"
    assert world.pool.drained == ["web-0"]
    assert [c.target for c in world.sent.commands] == ["web-0"]
    assert [line.action for line in world.store.query() if line.kind == "action"] == ["drain", "approve"]
    assert "notice of action approve for event E-REBOOT not sent" in caplog.text
    # ... each line with the event and the VM in its fields, where a query by event finds it
    assert {(getattr(r, "event_id", None), getattr(r, "vm", None)) for r in caplog.records} == {("E-REBOOT", "web-0")}


def test_the_template_shapes_every_body(world: World) -> None:
    template = '{"vm": "${vm}", "what": "${kind}/${action}", "result": "${result}", "rule": "${rule}"}'
    world.run(reboot(EventStatus.SCHEDULED), template=template)
    assert world.notifier.bodies() == [
        {"vm": "web-0", "what": "decision/", "result": "", "rule": "5-platform"},
        {"vm": "web-0", "what": "action/drain", "result": "done", "rule": "5-platform"},
        {"vm": "web-0", "what": "action/approve", "result": "done", "rule": "5-platform"},
    ]
