"""Refused reports in notices: records nobody can vouch for (unverified, not-self, malformed) are
never announced one by one, but counted into at most one summary per interval, on a queue of their
own, so that a flood of them can neither fill a channel nor push out a genuine notice."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest

from functions.core.notify import Notice, NoticeFilter, NotifyingAuditLog, WebhookTemplate
from functions.core.policy import Policy
from functions.core.ports import AuditRecord
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from functions.notify import WebhookNotifier
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender, RecordingWebhook
from wire.envelope import Envelope, encode, envelope_for_event
from wire.identity import Identity, UnverifiedError
from wire.model import EventKind, EventStatus, MaintenanceEvent

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
INTERVAL = 60.0


@dataclass
class Notices:
    """A Notifier that keeps what it is given, genuine notices and summaries apart."""

    notices: list[Notice] = field(default_factory=list)

    def notify(self, notice: Notice) -> None:
        self.notices.append(notice)

    def genuine(self) -> list[Notice]:
        return [notice for notice in self.notices if not notice.refusals]

    def summaries(self) -> list[str]:
        return [json.loads(notice.body)["text"] for notice in self.notices if notice.refusals]


@dataclass
class Setup:
    store: SqliteStore
    notices: Notices
    clock: FakeClock
    audit: NotifyingAuditLog


@pytest.fixture
def setup() -> Iterator[Setup]:
    store, notices, clock = SqliteStore(":memory:"), Notices(), FakeClock(NOW)
    audit = NotifyingAuditLog(store, notices, cloud="azure", summary_seconds=INTERVAL, monotonic=clock.monotonic)
    yield Setup(store, notices, clock, audit)
    store.close()


def refused(kind: str = "unverified", vm: str = "evil-0", reason: str = "unverified: no valid proof") -> AuditRecord:
    return AuditRecord(NOW, kind, "env", "E-FORGED", vm, action="none", status="scheduled", reason=reason)


def drained(vm: str = "web-0") -> AuditRecord:
    return AuditRecord(NOW, "action", "env", "E-1", vm, action="drain", status="scheduled", reason="drained")


def test_refused_records_are_summarised_not_announced_one_by_one(setup: Setup) -> None:
    # GIVEN a thousand unverified records within one interval, a genuine drain among them
    for index in range(1000):
        setup.audit.append(refused(vm=f"evil-{index}"))
        if index == 500:
            setup.audit.append(drained())
    # THEN the drain was announced, and the refusals made one summary: the first, at once
    assert [notice.action for notice in setup.notices.genuine()] == ["drain"]
    assert len(setup.notices.summaries()) == 1
    assert "1 refused report" in setup.notices.summaries()[0]
    # WHEN the interval is over THEN the 999 others make one more
    setup.clock.advance(INTERVAL)
    setup.audit.summarise_due()
    assert len(setup.notices.summaries()) == 2
    assert "999 refused reports" in setup.notices.summaries()[1]
    # AND nothing is left to summarise
    setup.clock.advance(10 * INTERVAL)
    setup.audit.summarise_due()
    assert len(setup.notices.summaries()) == 2
    # AND the audit log holds every record
    assert len(setup.store.query()) == 1001


def test_a_summary_goes_at_most_once_per_interval(setup: Setup) -> None:
    setup.audit.append(refused())
    assert len(setup.notices.summaries()) == 1
    # refusals within the interval wait for its end, however often one comes or anyone asks
    for _ in range(59):
        setup.clock.advance(1.0)
        setup.audit.append(refused(kind="not-self"))
        setup.audit.summarise_due()
    assert len(setup.notices.summaries()) == 1
    setup.clock.advance(1.0)
    setup.audit.summarise_due()
    assert len(setup.notices.summaries()) == 2
    assert "59 refused reports" in setup.notices.summaries()[1]
    # a refusal after a quiet interval is summarised at once again
    setup.clock.advance(2 * INTERVAL)
    setup.audit.append(refused(kind="malformed", vm=""))
    assert len(setup.notices.summaries()) == 3


def test_a_summary_counts_each_kind_and_quotes_a_few_bounded_escaped_samples(setup: Setup) -> None:
    setup.audit.append(refused())  # the first goes at once
    # GIVEN refusals of all three kinds, with markup and long texts in what their senders chose
    setup.audit.append(refused(vm="x" * 300, reason="unverified: <!channel> " + "y" * 500))
    setup.audit.append(refused(kind="not-self", vm="@here", reason="not-self: <https://evil.example|click>"))
    for _ in range(5):
        setup.audit.append(refused(kind="malformed", vm="", reason="not JSON [x](https://evil.example)"))
    # WHEN the interval is over
    setup.clock.advance(INTERVAL)
    setup.audit.summarise_due()
    text = setup.notices.summaries()[1]
    # THEN one line counts them by kind, quotes the first three cut short, and carries no markup
    assert text.startswith(
        "[maintenance-bridge] 7 refused reports since 2026-03-01T12:00:00Z (1 unverified, 1 not-self, 5 malformed), "
        "nothing done for them; the first 3: unverified from 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…' "
    )
    assert "y" * 100 not in text
    assert "from '@\u200bhere'" in text
    assert "&lt;!channel&gt;" in text
    assert not {"<", ">"} & set(text)
    assert "](" not in text
    assert "://" not in text
    assert text.count("malformed message") == 1
    assert len(text) < 1000


def test_the_summary_fills_the_template_with_what_it_is(setup: Setup) -> None:
    store, notices = setup.store, Notices()
    template = '{"kind": "${kind}", "action": "${action}", "result": "${result}", "vm": "${vm}", "cloud": "${cloud}"}'
    audit = NotifyingAuditLog(
        store, notices, WebhookTemplate.parse(template), cloud="gce", monotonic=setup.clock.monotonic
    )
    audit.append(refused())
    assert [json.loads(notice.body) for notice in notices.notices] == [
        {"kind": "refused", "action": "summary", "result": "refused", "vm": "", "cloud": "gce"}
    ]


def test_a_filter_that_leaves_refusals_out_summarises_none(setup: Setup) -> None:
    notices = Notices()
    audit = NotifyingAuditLog(
        setup.store, notices, notice_filter=NoticeFilter.parse("drain"), monotonic=setup.clock.monotonic
    )
    for _ in range(10):
        audit.append(refused())
    audit.append(drained())
    setup.clock.advance(INTERVAL)
    audit.summarise_due()
    assert [(notice.action, notice.refusals) for notice in notices.notices] == [("drain", False)]


def test_all_summarises_refusals_too(setup: Setup) -> None:
    notices = Notices()
    audit = NotifyingAuditLog(
        setup.store, notices, notice_filter=NoticeFilter.parse("all"), monotonic=setup.clock.monotonic
    )
    for _ in range(10):
        audit.append(refused())
    assert [notice.refusals for notice in notices.notices] == [True]


def test_settle_sends_a_summary_that_fell_due(setup: Setup) -> None:
    # (Cloud Functions settles after each message: a summary due by then goes with it)
    setup.audit.append(refused())
    setup.audit.append(refused())
    setup.clock.advance(INTERVAL)
    assert setup.audit.settle(1.0)
    assert len(setup.notices.summaries()) == 2


def test_held_refusals_ask_for_a_wake_up_when_their_summary_falls_due(setup: Setup) -> None:
    asked: list[float] = []
    audit = NotifyingAuditLog(
        setup.store, Notices(), monotonic=setup.clock.monotonic, summary_seconds=INTERVAL, on_held=asked.append
    )
    audit.append(refused())  # summarised at once: nothing held
    setup.clock.advance(15)
    audit.append(refused())
    assert asked == [45.0]


# ---------------------------------------------------------------- a flood, through process() and the webhook


class ProofOnlyFor:
    """A verifier that vouches for the VMs it is given and for no one else."""

    def __init__(self, *vms: str) -> None:
        self.vms = vms

    def verify(self, envelope: Envelope, accepted_at: datetime, now: datetime) -> Identity:
        vm = envelope.source.rsplit("/", 1)[-1]
        if vm not in self.vms:
            raise UnverifiedError(f"no valid proof from {vm}")
        return Identity(vm, "attested")


def report(reporter: str, status: EventStatus, description: str = "") -> MaintenanceEvent:
    return azure_event(
        kind=EventKind.REBOOT,
        status=status,
        reporter=reporter,
        resources=(reporter,),
        not_before=NOW + timedelta(minutes=15),
        event_id=f"E-{reporter}",
        description=description or "reboot",
    )


def test_a_flood_of_unverified_reports_never_pushes_out_a_genuine_notice() -> None:
    # GIVEN the webhook notifier as the apps wire it, in front of a webhook that takes nothing yet
    # (so every notice waits in its queue), and a clock that moves only when told
    store, clock, client = SqliteStore(":memory:"), FakeClock(NOW), RecordingWebhook(threading.Event())
    notifier = WebhookNotifier(client)
    audit = NotifyingAuditLog(store, notifier, cloud="azure", monotonic=clock.monotonic)
    deps = Deps(
        store=store,
        balancer=FakeBalancer({"web": ("web-0",)}),
        sender=RecordingSender(),
        audit=audit,
        policy=Policy(),
        monotonic=clock.monotonic,
        verifier=ProofOnlyFor("web-0"),
    )
    # WHEN web-0's Reboot is scheduled (decision, drain, approval), then a thousand forged reports
    # come, then web-0's Reboot completes (decision, restore)
    process(encode(envelope_for_event(report("web-0", EventStatus.SCHEDULED), NOW)), deps, NOW)
    for index in range(1000):
        forged = report(f"evil-{index}", EventStatus.SCHEDULED, "<!channel> <https://evil.example|click>")
        assert process(encode(envelope_for_event(forged, NOW)), deps, NOW).result == "unverified"
    process(encode(envelope_for_event(report("web-0", EventStatus.COMPLETED), NOW)), deps, NOW)
    # AND the webhook takes what waits
    assert client.gate is not None
    client.gate.set()
    assert notifier.settle(60.0)
    # THEN every genuine notice went out, in order, none dropped; of the refusals one summary so far
    texts = client.texts()
    genuine = [text for text in texts if "refused report" not in text]
    assert [text.split(" ")[1:3] for text in genuine] == [
        ["web-0:", "reboot"],
        ["web-0", "taken"],
        ["web-0:", "reboot"],
        ["web-0:", "reboot"],
        ["web-0", "put"],
    ]
    assert "approved" in genuine[2]
    assert notifier.counts() == {"sent": 5, "failed": 0, "dropped": 0, "retried": 0}
    assert [text for text in texts if "refused report" in text] == [
        "[maintenance-bridge] 1 refused report since 2026-03-01T12:00:00Z (1 unverified), nothing done for "
        "them; the first: unverified from 'evil-0' (unverified: no valid proof from evil-0)"
    ]
    # WHEN the interval is over THEN the other 999 make the second summary, and the last
    clock.advance(INTERVAL)
    audit.summarise_due()
    assert notifier.settle(60.0)
    summaries = [text for text in client.texts() if "refused report" in text]
    assert len(summaries) == 2
    assert summaries[1].startswith(
        "[maintenance-bridge] 999 refused reports since 2026-03-01T12:00:00Z (999 unverified), nothing done"
    )
    assert notifier.summary_counts() == {"sent": 2, "failed": 0, "dropped": 0, "retried": 0}
    notifier.close()
    store.close()
