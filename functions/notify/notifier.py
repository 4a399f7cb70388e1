"""The Notifier port of `functions.core.notify` on a webhook: two queues, each with its own thread.

`notify` puts the notice in a queue and returns at once, so a webhook that is slow or down never
holds up a drain or an approval. Genuine notices (decisions, drains, approvals, restores, command
results: whatever the filter admits of what verified reports caused) and the summaries of refused
reports (functions/core/refusals.py) each have a queue and a worker of their own: summaries come
at most once per interval, and whatever becomes of their queue, they never take a genuine notice's
place. Each worker posts its notices in order with its own `WebhookClient`. Every outcome is
logged with the event id and counted (`counts`, `summary_counts`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Callable

from functions.core.log_fields import fields
from functions.core.notify import Notice
from functions.notify.webhook import Delivery, WebhookClient, where
from wire.background import DropOldestWorker, DropReason

LOGGER = logging.getLogger("mbridge.functions.notify")

# How many genuine notices may wait for the worker; beyond this the oldest is dropped (and counted):
# only a webhook down while a large event drains hundreds of VMs comes near it.
DEFAULT_CAPACITY = 256
# How many summaries may wait: one an interval, so this many intervals of a webhook that is down.
SUMMARY_CAPACITY = 4
# At most this many waiting notices go out as one digest post (docs/scale.md: a chat webhook takes
# about one post a second, a wave makes hundreds of notices a second).
MAX_DIGEST_NOTICES = 50
# Notices go out one by one while fewer than this wait (one event's decision, drain and approval
# read best as they come); a longer line is what a wave makes, and goes out as digests.
DIGEST_BACKLOG = 4

# Several notices → one (functions.core.notify.digest_notice with the deployment's template).
Digest = Callable[[Sequence[Notice]], Notice]


class DeliveryQueue:
    """Notices waiting for one worker thread (wire.background.DropOldestWorker), posted in order.

    The thread starts with the first notice. A full queue drops its oldest notice (counted as
    `dropped`, and logged with the number dropped so far): the newest say most about now. The thread
    is a daemon: a process that exits does not wait for it; `settle` waits for what is queued.
    """

    def __init__(self, client: WebhookClient, *, capacity: int, name: str, digest: Digest | None = None) -> None:
        self._client = client
        self._digest = digest
        self._worker: DropOldestWorker[Notice] = DropOldestWorker(
            self._send, capacity=capacity, on_drop=self._drop, name=name
        )
        self._lock = threading.Lock()
        self._counts = {"sent": 0, "failed": 0, "dropped": 0, "retried": 0}
        self._digests = 0

    def put(self, notice: Notice) -> None:
        self._worker.put(notice)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def digests(self) -> int:
        """Posts that carried several notices at once."""
        with self._lock:
            return self._digests

    def settle(self, timeout: float) -> bool:
        return self._worker.settle(timeout)

    def close(self, timeout: float) -> None:
        self._worker.close(timeout)
        self._client.close()

    def _drop(self, notice: Notice, reason: DropReason) -> None:
        with self._lock:
            self._counts["dropped"] += 1
            dropped = self._counts["dropped"]
        why = f"webhook queue full ({self._worker.capacity})" if reason == "full" else "webhook closed"
        for what, about in _described(notice):
            LOGGER.warning("%s: dropped the %s (%d dropped since start)", why, what, dropped, extra=about)

    def _send(self, notice: Notice) -> None:
        """Post `notice`; with a digest and a line of at least DIGEST_BACKLOG behind it, those too, as
        one post: the queue then empties as fast as the webhook takes posts, whatever the rate of
        notices."""
        if self._digest is not None and self._worker.waiting() >= DIGEST_BACKLOG:
            behind = self._worker.take_waiting(MAX_DIGEST_NOTICES - 1)
            if behind:
                try:
                    notice = self._digest([notice, *behind])
                except Exception:  # rendering must not lose the notices: post them one by one
                    unmade = Notice("", "", "digest", "digest", "", count=len(behind) + 1, carried=(notice, *behind))
                    for what, about in _described(unmade):
                        LOGGER.exception("webhook %s could not be made: posted one by one", what, extra=about)
                    for single in [notice, *behind]:
                        self._post(single)
                    return
                with self._lock:
                    self._digests += 1
        self._post(notice)

    def _post(self, notice: Notice) -> None:
        try:
            delivery = self._client.post(notice.body.encode("utf-8"))
        except Exception as error:  # the worker must outlive any one notice
            delivery = Delivery(False, 0, 0.0, f"unexpected {type(error).__name__}")
            for what, about in _described(notice):
                LOGGER.exception("posting the webhook %s failed unexpectedly", what, extra=about)
        with self._lock:
            # Counted per notice: a digest's post carries `count` of them.
            self._counts["sent" if delivery.sent else "failed"] += notice.count
            self._counts["retried"] += max(0, delivery.tries - 1)
            failed = self._counts["failed"]
        to = where(self._client.url)
        for what, about in _described(notice):
            if delivery.sent:
                LOGGER.info(
                    "webhook %s, sent to %s: %s after %d tries in %.1f s",
                    what,
                    to,
                    delivery.detail,
                    delivery.tries,
                    delivery.seconds,
                    extra=about,
                )
            else:
                LOGGER.warning(
                    "webhook %s, NOT sent to %s: %s after %d tries in %.1f s (%d failed since start)",
                    what,
                    to,
                    delivery.detail,
                    delivery.tries,
                    delivery.seconds,
                    failed,
                    extra=about,
                )


def _described(notice: Notice) -> list[tuple[str, dict[str, object]]]:
    """What the log says a notice is, and the fields of the event it is about: a line for each event
    it carries, so that one query by event id finds what became of the event's notices. A summary of
    refused reports names no event (nor does its notice: what a refused report names is a claim)."""
    if notice.refusals:
        return [("summary of refused reports", {})]
    if notice.carried:
        of_event = Counter(part.event_id for part in notice.carried)
        return [
            (f"digest of {notice.count} notices ({count} of event {event_id or '(none)'})", fields(event_id=event_id))
            for event_id, count in of_event.items()
        ]
    what = f"notice ({notice.kind} {notice.action}) for event {notice.event_id}, VM {notice.vm}"
    return [(what, fields(event_id=notice.event_id, vm=notice.vm))]


class WebhookNotifier:
    """Genuine notices on one `DeliveryQueue` (at most `capacity` waiting), summaries of refused
    reports on another (at most `summary_capacity`), each with a client of its own
    (`WebhookClient.twin`)."""

    def __init__(
        self,
        client: WebhookClient,
        capacity: int = DEFAULT_CAPACITY,
        summary_capacity: int = SUMMARY_CAPACITY,
        *,
        digest: Digest | None = None,
    ) -> None:
        """`digest`: how several genuine notices waiting at once become one post; None: one post each."""
        self._genuine = DeliveryQueue(client, capacity=capacity, name="mbridge-webhook", digest=digest)
        self._summaries = DeliveryQueue(client.twin(), capacity=summary_capacity, name="mbridge-webhook-summaries")

    def notify(self, notice: Notice) -> None:
        (self._summaries if notice.refusals else self._genuine).put(notice)

    def counts(self) -> dict[str, int]:
        """Genuine notices sent, failed (tries or time used up, or an answer not worth retrying),
        dropped (queue full, or closed), and retries made."""
        return self._genuine.counts()

    def digests(self) -> int:
        """Posts that carried several genuine notices at once."""
        return self._genuine.digests()

    def summary_counts(self) -> dict[str, int]:
        """The same, for the summaries of refused reports."""
        return self._summaries.counts()

    def settle(self, timeout: float) -> bool:
        """Wait until every queued notice was posted (or given up on); False when `timeout` ran out first."""
        deadline = time.monotonic() + timeout
        settled = self._genuine.settle(timeout)
        return self._summaries.settle(max(0.0, deadline - time.monotonic())) and settled

    def close(self, timeout: float = 0.0) -> None:
        """Stop taking notices; give those queued up to `timeout` to go out, then drop (and count)
        those still waiting and stop the workers."""
        deadline = time.monotonic() + timeout
        self._genuine.close(timeout)
        self._summaries.close(max(0.0, deadline - time.monotonic()))
