"""What the demo sees of its Google world while the flows run: the envelopes on the events topic
(pulled from a subscription of its own; Pub/Sub's publish time is the "published" stage) and the
audit log (queried from Firestore ten times a second).

Two threads gather them; `tell` hands what is new to the observer, each audit record once.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from contextlib import ExitStack
from datetime import datetime
from typing import TYPE_CHECKING, Any

from functions.core.ports import AuditRecord
from mbridge.demo.pubsub_bus import ADMIN_TIMEOUT, OBSERVER_SUBSCRIPTION, subscription_path
from mbridge.demo.timeline import Observer

if TYPE_CHECKING:  # the Google libraries are imported once they are known to be installed
    from functions.gcp_app.firestore_audit import FirestoreAuditLog

LOG = logging.getLogger("mbridge.demo.pubsub")

AUDIT_INTERVAL = 0.1
PULL_IDLE = 0.05


class PubSubWatch:
    """The envelopes and audit records gathered so far; nothing until `start`."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._envelopes: list[tuple[bytes, datetime]] = []
        self._audit: list[AuditRecord] = []
        self._audit_told = Counter[AuditRecord]()
        self._subscriber: Any = None
        self._audit_log: FirestoreAuditLog | None = None

    def start(self, subscriber: Any, audit_log: FirestoreAuditLog, cleanup: ExitStack) -> None:
        """Start the two threads; `cleanup` stops them."""
        self._subscriber = subscriber
        self._audit_log = audit_log
        threads = [
            threading.Thread(target=self._pull_envelopes, name="demo-observer", daemon=True),
            threading.Thread(target=self._read_audit, name="demo-audit", daemon=True),
        ]
        for thread in threads:
            thread.start()

        def stop_watching() -> None:
            self._stop.set()
            for thread in threads:
                thread.join(timeout=10)

        cleanup.callback(stop_watching)

    def tell(self, observer: Observer) -> None:
        """The envelopes pulled since the last call, in publish order, then the audit records not told yet."""
        with self._lock:
            envelopes, self._envelopes = self._envelopes, []
            records = list(self._audit)
        for body, published in sorted(envelopes, key=lambda item: item[1]):
            observer.envelope(body, published)
        # Records are told once each, whatever order the queries return them in.
        seen = Counter[AuditRecord]()
        for record in records:
            seen[record] += 1
            if seen[record] > self._audit_told[record]:
                self._audit_told[record] += 1
                observer.audit(record)

    def _pull_envelopes(self) -> None:
        from google.api_core import exceptions as api_errors

        subscription = subscription_path(OBSERVER_SUBSCRIPTION)
        while not self._stop.is_set():
            try:
                response = self._subscriber.pull(subscription=subscription, max_messages=100, timeout=1.0, retry=None)
                received = list(response.received_messages)
                if received:
                    ack_ids = [item.ack_id for item in received]
                    self._subscriber.acknowledge(subscription=subscription, ack_ids=ack_ids, timeout=ADMIN_TIMEOUT)
            except api_errors.DeadlineExceeded:
                continue
            except Exception:  # the emulator going away at the end, or a hiccup: try again
                if not self._stop.is_set():
                    LOG.exception("pulling from %s failed; retrying", subscription)
                self._stop.wait(0.5)
                continue
            with self._lock:
                self._envelopes.extend((bytes(item.message.data), item.message.publish_time) for item in received)
            if not received:
                self._stop.wait(PULL_IDLE)

    def _read_audit(self) -> None:
        assert self._audit_log is not None
        while not self._stop.is_set():
            try:
                records = list(self._audit_log.query())
            except Exception:
                if not self._stop.is_set():
                    LOG.exception("reading the audit log failed; retrying")
                self._stop.wait(0.5)
                continue
            with self._lock:
                self._audit = records
            self._stop.wait(AUDIT_INTERVAL)
