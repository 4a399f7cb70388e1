"""The GCP entry and the webhook: Cloud Functions gives an instance CPU only while it serves a
request, so the entry answers once its notices went out, within a bound (docs/operations.md)."""

from __future__ import annotations

import time

from functions.gcp_app.entry import NOTICE_SETTLE_SECONDS, handle_message
from functions.local_app.store import SqliteStore
from tests.unit.functions.test_notify_webhook import NOW, QUICK, Receiver, reboot, receiver, wired
from wire.envelope import encode, envelope_for_event
from wire.model import EventStatus

__all__ = ["receiver"]  # the fixture, used by name


def test_the_gcp_entry_answers_once_its_notices_are_out(receiver: Receiver) -> None:
    # GIVEN Cloud Functions, which gives an instance CPU only while it serves a request: notices
    # still queued when the request returns would wait for the next one
    receiver.answers = [503, 200, 200, 200]
    store = SqliteStore(":memory:")
    app = wired(store, receiver.url, QUICK)
    # WHEN the GCP entry handles a Reboot
    outcome = handle_message(encode(envelope_for_event(reboot(EventStatus.SCHEDULED), NOW)), app.deps, NOW)
    # THEN by the time it returns every notice went out (one after a retry), the approval first
    assert outcome.result == "processed"
    assert [command.target for command in app.sent.commands] == ["web-0"]
    assert app.notifier.counts()["sent"] == 3
    assert receiver.count() == 4
    store.close()


def test_the_gcp_entry_waits_for_notices_within_the_webhooks_bound_only(receiver: Receiver) -> None:
    # GIVEN a webhook that never answers
    receiver.answers = ["hang"] * 20
    store = SqliteStore(":memory:")
    app = wired(store, receiver.url, QUICK)
    # WHEN the GCP entry handles a Reboot THEN it answers within the bound, the approval sent
    start = time.monotonic()
    handle_message(encode(envelope_for_event(reboot(EventStatus.SCHEDULED), NOW)), app.deps, NOW)
    assert time.monotonic() - start < NOTICE_SETTLE_SECONDS + 1
    assert len(app.sent.commands) == 1
    app.notifier.close()
    store.close()
