"""The stand-in for Eventarc between the Pub/Sub emulator and the function.

Eventarc delivers a Pub/Sub message to a gen2 function as a binary-mode CloudEvent of type
`google.cloud.pubsub.topic.v1.messagePublished` whose data is `{"message", "subscription"}`. The
emulator's push subscription POSTs the bare `{"message", "subscription"}` instead, so a small
loopback HTTP server, `EventarcShim`, adds the CloudEvent headers, forwards the POST to
functions-framework and answers the emulator with the function's status: a non-2xx answer makes the
emulator redeliver, as Pub/Sub does for Eventarc.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

LOG = logging.getLogger("mbridge.demo.pubsub")

MESSAGE_PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"
PUBSUB_SOURCE = "//pubsub.googleapis.com/"
PUBSUB_MESSAGE_TYPE = "type.googleapis.com/google.pubsub.v1.PubsubMessage"
# How long the function may take for one message before the push is given up and redelivered
# (a delivery that meets a claim held by another invocation waits for it).
PUSH_ACK_DEADLINE = 60


def eventarc_request(push: Mapping[str, Any], topic: str) -> tuple[dict[str, str], bytes]:
    """The binary-mode CloudEvent Eventarc would POST to the function for a Pub/Sub push body
    `{"message": {...}, "subscription": "projects/P/subscriptions/S"}` of `topic` (a full path).

    Raises:
        ValueError: `push` is not a Pub/Sub push body.
    """
    message = push.get("message")
    if not isinstance(message, Mapping) or not isinstance(push.get("subscription"), str):
        raise ValueError("not a Pub/Sub push body: expected {'message': {...}, 'subscription': '...'}")
    message_id = message.get("messageId") or message.get("message_id")
    if not isinstance(message_id, str) or not message_id:
        raise ValueError("the pushed message has no messageId")
    headers = {
        "ce-specversion": "1.0",
        "ce-id": message_id,
        "ce-source": PUBSUB_SOURCE + topic,
        "ce-type": MESSAGE_PUBLISHED,
        "Content-Type": "application/json; charset=utf-8",
    }
    published = message.get("publishTime") or message.get("publish_time")
    if isinstance(published, str) and published:
        headers["ce-time"] = published
    delivered = {"@type": PUBSUB_MESSAGE_TYPE, **message}
    body = json.dumps({"message": delivered, "subscription": push["subscription"]}).encode()
    return headers, body


class EventarcShim:
    """A loopback HTTP server standing in for Eventarc: takes the emulator's push POSTs and
    forwards each to the function as a messagePublished CloudEvent; the function's status is the
    answer (2xx acknowledges, anything else makes the emulator redeliver)."""

    def __init__(self, function_url: str, topic: str, timeout: float = PUSH_ACK_DEADLINE) -> None:
        self.function_url = function_url
        self.topic = topic
        self.timeout = timeout
        self.delivered = Counter[int]()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="eventarc-shim", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/"

    def start(self) -> EventarcShim:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def forward(self, payload: bytes) -> tuple[int, bytes]:
        """Deliver one push body to the function; (status, body) to answer the emulator with."""
        try:
            headers, body = eventarc_request(json.loads(payload), self.topic)
        except ValueError as exc:  # JSONDecodeError is one
            LOG.error("push shim: refused a push that is not a Pub/Sub message: %s", exc)
            return 400, str(exc).encode()
        started = time.monotonic()
        try:
            response = requests.post(self.function_url, data=body, headers=headers, timeout=self.timeout)
        except requests.RequestException as exc:
            LOG.warning("push shim: message %s not delivered, the emulator will redeliver: %s", headers["ce-id"], exc)
            status, answer = 502, f"the function did not answer: {exc}".encode()
        else:
            status, answer = response.status_code, response.content
            took = (time.monotonic() - started) * 1000
            if 200 <= status < 300:
                LOG.info("push shim: message %s → function %d in %.0f ms", headers["ce-id"], status, took)
            else:
                LOG.warning(
                    "push shim: message %s → function %d in %.0f ms, the emulator will redeliver: %s",
                    headers["ce-id"], status, took, answer[:300].decode(errors="replace"),
                )  # fmt: skip
        with self._lock:
            self.delivered[status] += 1
        return status, answer

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        shim = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "mbridge-eventarc-shim"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                status, answer = shim.forward(self.rfile.read(length))
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                return  # forward() logs every delivery

        return Handler
