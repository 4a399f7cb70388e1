"""The webhook adapter (functions/notify/) against a real HTTP receiver on 127.0.0.1: retries and
their bounds, a receiver that hangs, the queue, what the logs say, and the settings of both apps."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from functions.azure_app import settings as azure_names
from functions.azure_app.settings import Settings as AzureSettings
from functions.azure_app.settings import SettingsError as AzureSettingsError
from functions.core.notify import (
    DEFAULT_FILTER,
    Notice,
    NoticeFilter,
    NotifyingAuditLog,
    WebhookTemplate,
    digest_notice,
)
from functions.core.policy import Policy
from functions.core.ports import AuditRecord
from functions.core.process import Deps, process
from functions.gcp_app.settings import Settings as GcpSettings
from functions.gcp_app.settings import SettingsError as GcpSettingsError
from functions.local_app.host import LocalFunctionHost
from functions.local_app.store import SqliteStore
from functions.notify import RetryBounds, SummaryWakeUp, WebhookClient, WebhookNotifier, notifying_audit, webhook_config
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from tests.waiting import wait_until
from wire.envelope import encode, envelope_for_event
from wire.identity import ReporterName
from wire.model import EventKind, EventStatus
from wire.transports.base import OutboundMessage
from wire.transports.local import LocalBus

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
# The part of a Slack or Teams URL that is the key: it must never reach a log line.
KEY_PATH = "T0000/B0000/s3cr3tK3y"
# Short bounds, so that the tests of giving up take about a second, not eight.
QUICK = RetryBounds(tries=3, try_seconds=0.4, total_seconds=1.5, backoff_seconds=0.05)


@dataclass
class Receiver:
    """A webhook receiver: records every request, and answers as `answers` says, in order (then 200).

    An answer is a status, a (status, headers) pair, or "hang": no answer until the test ends.
    """

    server: ThreadingHTTPServer
    answers: list[Any] = field(default_factory=list)
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Announce a body of a gigabyte and send none of it (until the test ends).
    huge_body: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/services/{KEY_PATH}"

    def bodies(self) -> list[Any]:
        with self.lock:
            return [json.loads(body) for _, _, body in self.requests]

    def count(self) -> int:
        with self.lock:
            return len(self.requests)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            peer = holder[0]
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with peer.lock:
                peer.requests.append((self.path, dict(self.headers), body))
                answer = peer.answers.pop(0) if peer.answers else 200
            if answer == "hang":
                peer.release.wait(30)
                return
            status, headers = answer if isinstance(answer, tuple) else (answer, {})
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if peer.huge_body:
                self.send_header("Content-Length", str(10**9))
                self.end_headers()
                self.wfile.flush()
                peer.release.wait(30)
                return
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:  # keep the test output quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    peer = Receiver(server)
    holder.append(peer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield peer
    peer.release.set()
    server.shutdown()
    server.server_close()


def notice(event_id: str = "E-1", text: str = "hello") -> Notice:
    return Notice(event_id, "web-0", "action", "approve", json.dumps({"text": text}))


# ---------------------------------------------------------------- one notice, with retries


def test_a_5xx_is_retried_until_it_is_accepted(receiver: Receiver) -> None:
    # GIVEN a receiver that fails twice, then accepts
    receiver.answers = [500, 503]
    # WHEN one body is posted
    delivery = WebhookClient(receiver.url, QUICK).post(b'{"text": "a"}')
    # THEN it went out on the third try, the same JSON body each time
    assert (delivery.sent, delivery.tries, delivery.detail) == (True, 3, "HTTP 200")
    assert receiver.bodies() == [{"text": "a"}] * 3
    assert {headers["Content-Type"] for _, headers, _ in receiver.requests} == {"application/json"}


def test_retry_after_is_honoured_within_the_bound(receiver: Receiver) -> None:
    # GIVEN a receiver that throttles once, asking for a second's pause
    receiver.answers = [(429, {"Retry-After": "1"})]
    start = time.monotonic()
    delivery = WebhookClient(receiver.url, RetryBounds(total_seconds=3.0, backoff_seconds=0.05)).post(b"{}")
    # THEN the second try came after the pause it asked for, not the 0.05 s backoff
    assert (delivery.sent, delivery.tries) == (True, 2)
    assert time.monotonic() - start >= 1.0


def test_a_retry_after_past_the_bound_gives_up_at_once(receiver: Receiver) -> None:
    receiver.answers = [(503, {"Retry-After": "120"})]
    start = time.monotonic()
    delivery = WebhookClient(receiver.url, QUICK).post(b"{}")
    assert (delivery.sent, delivery.tries) == (False, 1)
    assert delivery.detail == "HTTP 503; Retry-After 120 s is past the bound"
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize("status", [400, 404, 302])
def test_an_answer_that_no_retry_can_mend_is_not_retried(receiver: Receiver, status: int) -> None:
    # (a 302 is not followed: the body, and the key in the URL, go nowhere else)
    receiver.answers = [(status, {"Location": "http://127.0.0.1:9/elsewhere"})]
    delivery = WebhookClient(receiver.url, QUICK).post(b"{}")
    assert (delivery.sent, delivery.tries, delivery.detail) == (False, 1, f"HTTP {status}")
    assert receiver.count() == 1


def test_a_receiver_that_hangs_is_given_up_on_within_the_bound(receiver: Receiver) -> None:
    # GIVEN a receiver that never answers
    receiver.answers = ["hang"] * 5
    start = time.monotonic()
    delivery = WebhookClient(receiver.url, QUICK).post(b"{}")
    elapsed = time.monotonic() - start
    # THEN every try timed out and the whole took no longer than the bound (plus scheduling slack)
    assert not delivery.sent
    assert delivery.detail.startswith("no answer within")
    assert QUICK.try_seconds <= elapsed <= QUICK.total_seconds + 0.5
    # (three tries fit in the bound; a slow machine may leave room for only two)
    assert delivery.tries == receiver.count()
    assert delivery.tries >= 2


def test_the_default_bounds_are_three_tries_of_three_seconds_within_eight() -> None:
    assert RetryBounds() == RetryBounds(tries=3, try_seconds=3.0, total_seconds=8.0, backoff_seconds=0.5)


def test_nothing_listening_is_retried_then_reported(receiver: Receiver) -> None:
    # GIVEN a port nothing listens on (the receiver closed)
    url = receiver.url
    receiver.server.shutdown()
    receiver.server.server_close()
    delivery = WebhookClient(url, QUICK).post(b"{}")
    assert (delivery.sent, delivery.tries) == (False, 3)
    assert delivery.detail == "could not connect (ConnectionError)"


# ---------------------------------------------------------------- the notifier: queue, logs, counts


def test_notices_go_out_in_order_and_are_counted(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    notifier = WebhookNotifier(WebhookClient(receiver.url, QUICK))
    with caplog.at_level(logging.INFO, logger="mbridge.functions.notify"):
        for index in range(5):
            notifier.notify(notice(f"E-{index}", f"n{index}"))
        assert notifier.settle(5.0)
    notifier.close()
    assert [body["text"] for body in receiver.bodies()] == [f"n{index}" for index in range(5)]
    assert notifier.counts() == {"sent": 5, "failed": 0, "dropped": 0, "retried": 0}
    assert "webhook notice (action approve) for event E-3, VM web-0, sent to http://127.0.0.1: HTTP 200" in caplog.text


def test_a_full_queue_drops_its_oldest_notice(receiver: Receiver) -> None:
    # GIVEN a receiver that hangs on the first notice, and room for two more
    receiver.answers = ["hang"]
    notifier = WebhookNotifier(WebhookClient(receiver.url, RetryBounds(tries=1, try_seconds=1.0)), capacity=2)
    notifier.notify(notice("E-0"))
    wait_until(lambda: receiver.count() == 1, 5.0, "the first notice at the receiver")
    # WHEN three more come while it hangs
    for index in (1, 2, 3):
        notifier.notify(notice(f"E-{index}"))
    assert notifier.settle(5.0)
    notifier.close()
    # THEN the oldest waiting one (E-1) was dropped and counted, the others went out
    assert notifier.counts() == {"sent": 2, "failed": 1, "dropped": 1, "retried": 0}
    assert receiver.count() == 3


def test_notices_waiting_behind_a_slow_post_go_out_as_one_digest_in_order(receiver: Receiver) -> None:
    # GIVEN a webhook that takes its time over the first post (as a chat service taking one a second)
    receiver.answers = ["hang"]
    template = WebhookTemplate.parse()
    notifier = WebhookNotifier(
        WebhookClient(receiver.url, RetryBounds(tries=1, try_seconds=1.0)),
        digest=lambda notices: digest_notice(notices, template, "azure"),
    )
    lines = [f"[maintenance-bridge] web-{index} taken out of its pools" for index in range(10)]
    notifier.notify(Notice("E-0", "web-0", "action", "drain", json.dumps({"text": lines[0]}), line=lines[0]))
    wait_until(lambda: receiver.count() == 1, 5.0, "the first notice at the receiver")

    # WHEN nine more come while it is busy
    for index in range(1, 10):
        notifier.notify(
            Notice(
                f"E-{index}", f"web-{index}", "action", "drain", json.dumps({"text": lines[index]}), line=lines[index]
            )
        )
    assert notifier.settle(5.0)
    notifier.close()

    # THEN the nine went out in one post that lists them in order, and each notice is counted once
    assert receiver.count() == 2
    digest = receiver.bodies()[1]["text"]
    assert digest.startswith("[maintenance-bridge] 9 notices: web-1 taken out of its pools | web-2")
    assert [digest.index(f"web-{index} taken") for index in range(1, 10)] == sorted(
        digest.index(f"web-{index} taken") for index in range(1, 10)
    )
    assert notifier.counts() == {"sent": 9, "failed": 1, "dropped": 0, "retried": 0}
    assert notifier.digests() == 1


def test_a_digest_names_each_vm_and_event_once_and_keeps_them_inert() -> None:
    template = WebhookTemplate.parse('{"text": "${summary}", "vms": "${vm}", "events": "${event_id}", "k": "${kind}"}')
    notices = [
        Notice("E-1", "<!channel>", "action", "drain", "{}", line="[maintenance-bridge] &lt;!channel&gt; out"),
        Notice("E-1", "web-1", "action", "approve", "{}", line="[maintenance-bridge] web-1: approved"),
    ]
    body = json.loads(digest_notice(notices, template, "azure").body)
    assert body["text"] == "[maintenance-bridge] 2 notices: &lt;!channel&gt; out | web-1: approved"
    assert body["vms"] == "&lt;!channel&gt;, web-1"
    assert body["events"] == "E-1"
    assert body["k"] == "digest"


# ---------------------------------------------------------------- through process(): never in the way


def reboot(status: EventStatus) -> Any:
    return azure_event(
        kind=EventKind.REBOOT,
        status=status,
        reporter="web-0",
        resources=("web-0",),
        not_before=NOW + timedelta(minutes=15),
        event_id="E-REBOOT",
    )


@dataclass
class Wired:
    deps: Deps
    pool: FakeBalancer
    sent: RecordingSender
    notifier: WebhookNotifier


def wired(store: SqliteStore, url: str, bounds: RetryBounds, notice_filter: str | None = None, **options: Any) -> Wired:
    """The core's Deps as the apps wire them, with a webhook (default template and filter, unless
    `notice_filter` names what to announce; `options` are the notifier's)."""
    pool, sent = FakeBalancer({"web": ("web-0",)}), RecordingSender()
    notifier = WebhookNotifier(WebhookClient(url, bounds), **options)
    audit = NotifyingAuditLog(store, notifier, notice_filter=NoticeFilter.parse(notice_filter), cloud="azure")
    deps = Deps(
        store=store,
        balancer=pool,
        sender=sent,
        audit=audit,
        policy=Policy(),
        verifier=ReporterName(),
        monotonic=FakeClock().monotonic,
    )
    return Wired(deps, pool, sent, notifier)


def test_a_webhook_that_is_down_neither_delays_nor_fails_the_approval(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a webhook that answers 500 to everything
    receiver.answers = [500] * 20
    store = SqliteStore(":memory:")
    app = wired(store, receiver.url, QUICK)
    # WHEN a platform Reboot is processed
    with caplog.at_level(logging.INFO, logger="mbridge.functions.notify"):
        start = time.monotonic()
        outcome = process(encode(envelope_for_event(reboot(EventStatus.SCHEDULED), NOW)), app.deps, NOW)
        took = time.monotonic() - start
        assert app.notifier.settle(10.0)
    notifier = app.notifier
    # THEN the VM was drained and approved, without waiting for the webhook
    assert outcome.result == "processed"
    assert app.pool.drained == ["web-0"]
    assert [command.target for command in app.sent.commands] == ["web-0"]
    assert took < QUICK.total_seconds
    # AND each of the three notices (decision, drain, approval) was tried three times, then
    # logged with its event id and counted as failed
    assert notifier.counts() == {"sent": 0, "failed": 3, "dropped": 0, "retried": 6}
    assert receiver.count() == 9
    assert "webhook notice (action approve) for event E-REBOOT, VM web-0, NOT sent to http://127.0.0.1: HTTP 500" in (
        caplog.text
    )
    # AND no log line holds the key in the URL's path
    assert KEY_PATH not in caplog.text
    store.close()


def test_every_log_line_about_an_event_names_it_whatever_becomes_of_its_notices(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN the core wired with a webhook that announces every record, hangs on the first post, has
    # room for five notices waiting, and posts a backlog as one digest
    receiver.answers = ["hang"]
    store = SqliteStore(":memory:")
    template = WebhookTemplate.parse()
    app = wired(
        store,
        receiver.url,
        RetryBounds(tries=1, try_seconds=1.0),
        "all",
        capacity=5,
        digest=lambda notices: digest_notice(notices, template, "azure"),
    )
    with caplog.at_level(logging.DEBUG, logger="mbridge"):
        # WHEN web-0's Reboot is reported scheduled (its first notice hangs at the webhook) and
        # completed (six notices wait: one is dropped, the others go out as one digest), then its
        # completion again (a duplicate: one notice, alone)
        process(encode(envelope_for_event(reboot(EventStatus.SCHEDULED), NOW)), app.deps, NOW)
        wait_until(lambda: receiver.count() == 1, 5.0, "the first notice at the webhook")
        completed = encode(envelope_for_event(reboot(EventStatus.COMPLETED), NOW))
        process(completed, app.deps, NOW + timedelta(minutes=20))
        assert app.notifier.settle(10.0)
        process(completed, app.deps, NOW + timedelta(minutes=21))
        assert app.notifier.settle(10.0)
    app.notifier.close()
    store.close()

    # THEN a notice was given up on, one dropped, a digest and a single notice sent
    messages = [record.getMessage() for record in caplog.records]
    assert any("NOT sent" in message for message in messages), messages
    assert any("dropped the notice" in message for message in messages), messages
    assert any("digest of 5 notices (5 of event E-REBOOT), sent" in message for message in messages), messages
    assert any("notice (duplicate none) for event E-REBOOT, VM web-0, sent" in message for message in messages)
    # ... and every line logged while the event was handled names it, as jq and the log stores look for it
    unnamed = [(record.name, record.getMessage()) for record in caplog.records if not _names_event(record)]
    assert unnamed == []


def _names_event(record: logging.LogRecord) -> bool:
    return getattr(record, "event_id", None) == "E-REBOOT"


def test_a_digest_of_several_events_is_logged_once_for_each(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a webhook busy with a first notice while notices of two events wait behind it
    receiver.answers = ["hang"]
    template = WebhookTemplate.parse()
    notifier = WebhookNotifier(
        WebhookClient(receiver.url, RetryBounds(tries=1, try_seconds=1.0)),
        digest=lambda notices: digest_notice(notices, template, "azure"),
    )
    with caplog.at_level(logging.INFO, logger="mbridge.functions.notify"):
        notifier.notify(notice("E-0"))
        wait_until(lambda: receiver.count() == 1, 5.0, "the first notice at the receiver")
        for event_id in ("E-1", "E-2", "E-1", "E-1", "E-2"):
            notifier.notify(notice(event_id))
        assert notifier.settle(5.0)
    notifier.close()

    # THEN the digest's post is logged once per event it carried, each line naming its event
    lines = [(getattr(record, "event_id", None), record.getMessage()) for record in caplog.records]
    digest = [(event_id, message.split(", sent")[0]) for event_id, message in lines if "digest" in message]
    assert digest == [
        ("E-1", "webhook digest of 5 notices (3 of event E-1)"),
        ("E-2", "webhook digest of 5 notices (2 of event E-2)"),
    ]
    assert all(event_id for event_id, _ in lines)


def test_a_failure_inside_the_notifier_is_logged_for_each_event_it_hit(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a webhook busy with a first notice while notices of two events wait, and a digest that
    # cannot be made; and a notifier whose HTTP session breaks
    receiver.answers = ["hang"]

    def no_digest(notices: Any) -> Notice:
        raise RuntimeError("the template broke")

    notifier = WebhookNotifier(WebhookClient(receiver.url, RetryBounds(tries=1, try_seconds=1.0)), digest=no_digest)

    class BrokenSession(requests.Session):
        def post(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the session broke")

    broken = WebhookNotifier(WebhookClient(receiver.url, QUICK, session=BrokenSession()))
    with caplog.at_level(logging.INFO, logger="mbridge.functions.notify"):
        notifier.notify(notice("E-0"))
        wait_until(lambda: receiver.count() == 1, 5.0, "the first notice at the receiver")
        for event_id in ("E-1", "E-2", "E-1", "E-1", "E-2"):
            notifier.notify(notice(event_id))
        broken.notify(notice("E-3"))
        assert notifier.settle(5.0)
        assert broken.settle(5.0)
    notifier.close()
    broken.close()

    # THEN the digest's failure is logged once per event, the notices then go out one by one, and the
    # broken post is logged with its event: every line names one
    lines = [(getattr(record, "event_id", None), record.getMessage()) for record in caplog.records]
    assert [line for line in lines if "could not be made" in line[1]] == [
        ("E-1", "webhook digest of 5 notices (3 of event E-1) could not be made: posted one by one"),
        ("E-2", "webhook digest of 5 notices (2 of event E-2) could not be made: posted one by one"),
    ]
    assert receiver.count() == 6
    assert ("E-3", "posting the webhook notice (action approve) for event E-3, VM web-0 failed unexpectedly") in lines
    assert all(event_id for event_id, _ in lines), lines


def test_a_hanging_webhook_does_not_hold_up_processing(receiver: Receiver) -> None:
    receiver.answers = ["hang"] * 20
    store = SqliteStore(":memory:")
    app = wired(store, receiver.url, QUICK)
    start = time.monotonic()
    process(encode(envelope_for_event(reboot(EventStatus.SCHEDULED), NOW)), app.deps, NOW)
    assert time.monotonic() - start < QUICK.try_seconds
    assert len(app.sent.commands) == 1
    app.notifier.close()
    store.close()


def test_the_local_host_posts_the_default_notices(receiver: Receiver, tmp_path: Path) -> None:
    # GIVEN the local function host with a webhook, and a Reboot of web-0 on its bus
    bus, store = LocalBus(tmp_path / "bus.db"), SqliteStore(tmp_path / "functions.db")
    host = LocalFunctionHost(
        bus,
        store,
        FakeBalancer({"web": ["web-0"]}),
        Policy(),
        lambda: NOW,
        verifier=ReporterName(),
        webhook=webhook_config(receiver.url, None, None),
    )
    envelope = envelope_for_event(reboot(EventStatus.SCHEDULED), NOW)
    bus.publish_event(OutboundMessage(envelope.id, encode(envelope), "web-0"))
    # WHEN it takes the message
    assert host.step() == 1
    # THEN the receiver got the decision, the drain and the approval as Slack/Teams text
    wait_until(lambda: receiver.count() == 3, 5.0, lambda: f"3 notices, got {receiver.bodies()}")
    texts = [body["text"] for body in receiver.bodies()]
    assert texts[0].startswith("[maintenance-bridge] web-0: reboot E-REBOOT scheduled, rule 5-platform")
    assert texts[2].startswith("[maintenance-bridge] web-0: reboot E-REBOOT approved, to start at ")
    bus.close()
    store.close()


# ---------------------------------------------------------------- settings of both apps

AZURE_MINIMAL = {
    azure_names.EVENTS_TOPIC: "maintenance-events",
    azure_names.EVENTS_SUBSCRIPTION: "functions",
    azure_names.SERVICEBUS_NAMESPACE: "mybus.servicebus.windows.net",
    azure_names.TABLE_ENDPOINT: "https://myaccount.table.core.windows.net",
    azure_names.TRUST_SUBSCRIPTIONS: "00000000-0000-0000-0000-000000000000",
    azure_names.TRUST_RESOURCE_GROUPS: "rg-web",
}
GCP_MINIMAL = {"MBRIDGE_GCP_PROJECT": "my-project-123"}
HOOK = f"https://hooks.slack.com/services/{KEY_PATH}"


def read_both(environ: dict[str, str]) -> list[Any]:
    return [AzureSettings.from_env({**AZURE_MINIMAL, **environ}), GcpSettings.from_env({**GCP_MINIMAL, **environ})]


def test_without_a_url_there_is_no_webhook() -> None:
    assert [settings.webhook for settings in read_both({})] == [None, None]


def test_both_apps_read_the_webhook_settings() -> None:
    environ = {
        "MBRIDGE_WEBHOOK_URL": HOOK,
        "MBRIDGE_WEBHOOK_TEMPLATE": '{"text": "${vm}: ${action}"}',
        "MBRIDGE_WEBHOOK_ACTIONS": "approve,restore_failed",
    }
    for settings in read_both(environ):
        assert settings.webhook.url == HOOK
        assert settings.webhook.template.names == ("vm", "action")
        assert settings.webhook.notice_filter.names == {"approve", "restore_failed"}
        # the URL is a secret: it stays out of the settings' repr
        assert KEY_PATH not in repr(settings)
    assert read_both({"MBRIDGE_WEBHOOK_URL": HOOK})[0].webhook.notice_filter.names == set(DEFAULT_FILTER)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"MBRIDGE_WEBHOOK_URL": f"http://hooks.example.com/{KEY_PATH}"},
            "MBRIDGE_WEBHOOK_URL: the URL's scheme is 'http'",
        ),
        ({"MBRIDGE_WEBHOOK_URL": "hooks.slack.com/services/x"}, "MBRIDGE_WEBHOOK_URL: not a URL with a host"),
        ({"MBRIDGE_WEBHOOK_URL": "https://:99999/x"}, "MBRIDGE_WEBHOOK_URL: not a URL"),
        (
            {"MBRIDGE_WEBHOOK_URL": HOOK, "MBRIDGE_WEBHOOK_TEMPLATE": '{"text": "${host}"}'},
            r"MBRIDGE_WEBHOOK_TEMPLATE: unknown placeholder \$\{host\}",
        ),
        (
            {"MBRIDGE_WEBHOOK_URL": HOOK, "MBRIDGE_WEBHOOK_TEMPLATE": '{"text": ${summary}}'},
            "MBRIDGE_WEBHOOK_TEMPLATE: the template does not render to valid JSON",
        ),
        (
            {"MBRIDGE_WEBHOOK_URL": HOOK, "MBRIDGE_WEBHOOK_ACTIONS": "drains"},
            "MBRIDGE_WEBHOOK_ACTIONS: 'drains' is not",
        ),
        ({"MBRIDGE_WEBHOOK_ACTIONS": "approve"}, "MBRIDGE_WEBHOOK_ACTIONS set without MBRIDGE_WEBHOOK_URL"),
    ],
)
def test_a_wrong_webhook_setting_stops_both_apps_naming_it(environ: dict[str, str], message: str) -> None:
    with pytest.raises(AzureSettingsError, match=message) as azure:
        AzureSettings.from_env({**AZURE_MINIMAL, **environ})
    with pytest.raises(GcpSettingsError, match=message) as gcp:
        GcpSettings.from_env({**GCP_MINIMAL, **environ})
    # and never quotes the key in the URL's path
    assert KEY_PATH not in str(azure.value) + str(gcp.value)


def test_http_is_taken_for_a_local_receiver_only() -> None:
    for url in ("http://127.0.0.1:8080/hook", "http://localhost/hook", "http://[::1]:9/hook"):
        assert [settings.webhook.url for settings in read_both({"MBRIDGE_WEBHOOK_URL": url})] == [url, url]


def test_an_unresolved_key_vault_reference_is_named_on_azure() -> None:
    reference = "@Microsoft.KeyVault(SecretUri=https://v.vault.azure.net/secrets/webhook/)"
    with pytest.raises(AzureSettingsError, match="MBRIDGE_WEBHOOK_URL: the Key Vault reference was not resolved"):
        AzureSettings.from_env({**AZURE_MINIMAL, "MBRIDGE_WEBHOOK_URL": reference})


def test_the_answers_body_is_never_read(receiver: Receiver) -> None:
    # GIVEN a receiver that accepts, announcing a body of a gigabyte it never sends
    receiver.answers = [(200, {"X-Body": "huge"})]
    receiver.huge_body = True
    client = WebhookClient(receiver.url, QUICK)
    # WHEN a notice is posted THEN the status is enough: it is sent, without waiting for the body
    start = time.monotonic()
    delivery = client.post(b'{"text": "hello"}')
    assert delivery.sent, delivery.detail
    assert time.monotonic() - start < QUICK.try_seconds
    client.close()


# ---------------------------------------------------------------- refused reports: the interval, the wake-up


def test_both_apps_read_the_summary_interval() -> None:
    for settings in read_both({"MBRIDGE_WEBHOOK_URL": HOOK, "MBRIDGE_WEBHOOK_SUMMARY_SECONDS": "120"}):
        assert settings.webhook.summary_seconds == 120.0
    for settings in read_both({"MBRIDGE_WEBHOOK_URL": HOOK}):
        assert settings.webhook.summary_seconds == 60.0


@pytest.mark.parametrize("value", ["0", "0.5", "3601", "a minute", "nan", "-60"])
def test_a_summary_interval_out_of_bounds_stops_both_apps(value: str) -> None:
    environ = {"MBRIDGE_WEBHOOK_URL": HOOK, "MBRIDGE_WEBHOOK_SUMMARY_SECONDS": value}
    message = "MBRIDGE_WEBHOOK_SUMMARY_SECONDS: .* is not a number of seconds from 1 to 3600"
    with pytest.raises(AzureSettingsError, match=message):
        AzureSettings.from_env({**AZURE_MINIMAL, **environ})
    with pytest.raises(GcpSettingsError, match=message):
        GcpSettings.from_env({**GCP_MINIMAL, **environ})


def test_a_summary_interval_without_a_url_is_named() -> None:
    with pytest.raises(AzureSettingsError, match="MBRIDGE_WEBHOOK_SUMMARY_SECONDS set without MBRIDGE_WEBHOOK_URL"):
        AzureSettings.from_env({**AZURE_MINIMAL, "MBRIDGE_WEBHOOK_SUMMARY_SECONDS": "60"})


def test_a_full_queue_says_how_many_it_dropped(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN a receiver that hangs on the first notice, and room for one more
    receiver.answers = ["hang"]
    notifier = WebhookNotifier(WebhookClient(receiver.url, RetryBounds(tries=1, try_seconds=1.0)), capacity=1)
    notifier.notify(notice("E-0"))
    wait_until(lambda: receiver.count() == 1, 5.0, "the first notice at the receiver")
    # WHEN three more come while it hangs
    with caplog.at_level(logging.WARNING, logger="mbridge.functions.notify"):
        for index in (1, 2, 3):
            notifier.notify(notice(f"E-{index}"))
    assert notifier.settle(5.0)
    notifier.close()
    # THEN each drop was logged with the count so far
    assert "webhook queue full (1): dropped the notice (action approve) for event E-1, VM web-0 (1 dropped" in (
        caplog.text
    )
    assert "for event E-2, VM web-0 (2 dropped since start)" in caplog.text
    assert notifier.counts()["dropped"] == 2


def test_a_summary_that_falls_due_while_no_record_comes_is_sent_by_a_timer(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN the audit log as the apps wire it, summarising refusals at most once a second
    store = SqliteStore(":memory:")
    config = webhook_config(receiver.url, None, None, "1")
    audit = notifying_audit(store, config)
    forged = AuditRecord(NOW, "unverified", "env", "E-X", "evil-0", action="none", reason="unverified: no proof")
    # WHEN two refusals come: the first is summarised at once, the second is held
    with caplog.at_level(logging.INFO, logger="mbridge.functions.notify"):
        audit.append(forged)
        audit.append(forged)
        # THEN with no record after it, its summary still goes out once the second is over
        wait_until(lambda: receiver.count() == 2, 10.0, lambda: f"two summaries, got {receiver.bodies()}")
    texts = [body["text"] for body in receiver.bodies()]
    assert all(text.startswith("[maintenance-bridge] 1 refused report since ") for text in texts)
    assert "1 unverified refused since 2026-03-01T12:00:00Z: one summary notice" in caplog.text
    assert "webhook summary of refused reports, sent to http://127.0.0.1: HTTP 200" in caplog.text
    store.close()


def test_the_wake_up_keeps_at_most_one_timer() -> None:
    fired = threading.Event()
    wake_up = SummaryWakeUp(fired.set, name="wake-up-under-test")
    wake_up.schedule(600.0)
    wake_up.schedule(600.0)
    assert [thread.name for thread in threading.enumerate()].count("wake-up-under-test") == 1
    wake_up.cancel()
    wake_up.schedule(0.0)
    assert fired.wait(10.0)
