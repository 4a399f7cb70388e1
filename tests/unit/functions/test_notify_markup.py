"""Chat markup in notices (functions/core/chat_markup.py): a value taken from a report or an envelope
is text its sender chose, so it reaches a channel as text, never as a mention, a link or a
Slack control sequence, in a genuine notice as in a summary of refusals."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from functions.core.chat_markup import neutralised
from functions.core.notify import Notice, NoticeFilter, NotifyingAuditLog, WebhookTemplate, notice_values
from functions.core.policy import Policy
from functions.core.ports import AuditRecord
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.envelope import encode, envelope_for_event
from wire.identity import ReporterName
from wire.model import EventKind, EventStatus

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
# What a sender may put in a description or a reason to reach people who read the channel.
SLACK_MARKUP = "<!channel> <!here> <@U123> <#C42> <!subteam^S1> <https://evil.example/login|click here>"


def record_with(reason: str, vm: str = "web-0") -> AuditRecord:
    return AuditRecord(NOW, "action", "env", "E-1", vm, action="drain", status="scheduled", reason=reason)


def text_of(record: AuditRecord) -> str:
    return notice_values(record)["summary"]


def test_slack_markup_in_a_value_is_escaped_as_slack_documents() -> None:
    # GIVEN a reason holding Slack's control sequences (broadcasts, a user, a channel, a group, a link)
    # and an ampersand
    text = text_of(record_with(f"{SLACK_MARKUP} & more"))
    # THEN none of them is markup any more: Slack shows &lt; &gt; &amp; as the characters themselves
    assert "<" not in text
    assert ">" not in text
    assert "&lt;!channel&gt; &lt;!here&gt; &lt;@\u200bU123&gt; &lt;#C42&gt;" in text
    assert "&lt;https://evil.example/login|click here&gt;".replace("://", ":\u200b//") in text
    assert text.endswith(" &amp; more")


@pytest.mark.parametrize("mention", ["@channel", "@here", "@everyone", "@someone"])
def test_broadcast_and_user_mentions_in_a_value_are_made_inert(mention: str) -> None:
    text = text_of(record_with(f"ping {mention} now"))
    # an invisible zero-width space after the @: read the same, matched by no mention parser
    assert mention not in text
    assert f"ping @\u200b{mention[1:]} now" in text


def test_markdown_links_and_bare_urls_in_a_value_are_broken() -> None:
    # GIVEN a Teams/Discord masked link and a bare URL (which every chat client links by itself)
    text = text_of(record_with("see [the runbook](https://evil.example/a) or http://evil.example/b"))
    # THEN neither is a link: the `](` and the `://` each carry a zero-width space
    assert "](" not in text
    assert "://" not in text
    assert "[the runbook]\u200b(https:\u200b//evil.example/a) or http:\u200b//evil.example/b" in text


def test_every_placeholder_taken_from_a_record_is_neutralised() -> None:
    # GIVEN a record whose every field a sender could choose holds markup
    record = AuditRecord(
        NOW,
        "unverified",
        "<!channel>",
        "<@U1>",
        "@here",
        action="none",
        status="<x>",
        rule="a&b",
        reason="[a](b)",
        detail={"kind": "<k>", "cloud": "@everyone"},
    )
    values = notice_values(record)
    # THEN no value carries a Slack control character or a live mention
    for name, value in values.items():
        assert not {"<", ">"} & set(value), name
        assert not any(mention in value for mention in ("@here", "@everyone")), name
        assert "](" not in value, name


def test_neutralising_leaves_plain_text_alone() -> None:
    plain = "[maintenance-bridge] web-0: reboot E-1 approved, to start at 2026-03-01T12:00:30Z: drained (5-platform)"
    assert neutralised(plain) == plain
    assert neutralised("") == ""


def test_a_vms_own_report_is_neutralised_in_genuine_notices() -> None:
    # GIVEN a VM (trusted: reporter-name) whose own report's description holds markup, and a filter
    # announcing every record
    store = SqliteStore(":memory:")
    notices: list[Notice] = []

    class Keep:
        def notify(self, notice: Notice) -> None:
            notices.append(notice)

    audit = NotifyingAuditLog(store, Keep(), WebhookTemplate.parse(None), NoticeFilter.parse("all"))
    deps = Deps(
        store=store,
        balancer=FakeBalancer({"web": ("web-0",)}),
        sender=RecordingSender(),
        audit=audit,
        policy=Policy(),
        monotonic=FakeClock(NOW).monotonic,
        verifier=ReporterName(),
    )
    event = azure_event(
        kind=EventKind.REBOOT,
        status=EventStatus.SCHEDULED,
        reporter="web-0",
        resources=("web-0",),
        not_before=NOW + timedelta(minutes=15),
        event_id="E-REBOOT",
        description=f"{SLACK_MARKUP} @channel [x](https://evil.example)",
    )
    # WHEN it is processed
    process(encode(envelope_for_event(event, NOW)), deps, NOW)
    # THEN the report was announced (with its description) and so were the drain and the approval,
    # and no body carries the markup
    bodies: list[dict[str, Any]] = [json.loads(notice.body) for notice in notices]
    assert [notice.kind for notice in notices] == ["event", "decision", "action", "action"]
    assert "&lt;!channel&gt;" in bodies[0]["text"]
    for body in bodies:
        assert not {"<", ">"} & set(body["text"])
        assert "@channel" not in body["text"]
        assert "](" not in body["text"]
    store.close()
