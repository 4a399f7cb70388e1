"""The one fake of the webhook port (`functions.notify.webhook.WebhookClient`)."""

from __future__ import annotations

import json
import threading
from typing import Any

from functions.notify.webhook import Delivery, WebhookClient


class RecordingWebhook(WebhookClient):
    """A webhook in memory that takes every post and keeps its JSON body, in order.

    Both queues of a `WebhookNotifier` post here (`twin` is this one), so `bodies` is what the channel
    shows. With a `gate`, each post waits until the test sets it (notices pile up in their queues).
    """

    def __init__(self, gate: threading.Event | None = None) -> None:
        super().__init__("http://127.0.0.1/hook")
        self.gate = gate
        self._lock = threading.Lock()
        self._bodies: list[dict[str, Any]] = []

    def twin(self) -> WebhookClient:
        return self

    def post(self, body: bytes) -> Delivery:
        if self.gate is not None:
            assert self.gate.wait(60), "the test never opened the gate"
        with self._lock:
            self._bodies.append(json.loads(body))
        return Delivery(True, 1, 0.0, "HTTP 200")

    def bodies(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._bodies)

    def texts(self) -> list[str]:
        return [str(body["text"]) for body in self.bodies()]
