"""The control plane's path in the demo's Google world, as infra/terraform/gcp deploys it:

    GCE simulator's system-event log ─► SinkRelay (as the log sink) ─► maintenance-central ─► push ─►
        EventarcShim ─► functions-framework on_central_log_entry
    Ticker (as Cloud Scheduler) ─► maintenance-central-tick ─► push ─► EventarcShim ─► on_central_tick

The relay reads the simulator's central feed (GET /_sim/central/events) and publishes each log entry
as the message's data, JSON, as a log sink does; the ticker publishes a tick every second (a minute
in the cloud), so that the demo's short silence bound is found in seconds.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import requests

from mbridge.demo.pubsub_bus import ADMIN_TIMEOUT, CENTRAL_TOPIC, TICK_TOPIC, topic_path

LOG = logging.getLogger("mbridge.demo.pubsub")

TICK_EVERY = 1.0  # real seconds between the ticker's messages
READ_EVERY = 0.2  # real seconds between reads of the simulator's feed when it had nothing new


class SinkRelay:
    """Publishes the GCE simulator's system-event log entries to the sink's topic, each once, in order."""

    def __init__(self, feed_url: str, publisher: Any) -> None:
        self._url = feed_url.rstrip("/") + "/_sim/central/events"
        self._publisher = publisher
        self._position = 0
        self.published = 0

    def step(self) -> int:
        try:
            answer = requests.get(self._url, params={"after": self._position, "limit": 100}, timeout=5)
            answer.raise_for_status()
            entries = answer.json()["events"]
        except (requests.RequestException, ValueError, KeyError) as exc:
            LOG.warning("sink relay: the simulator's feed cannot be read now: %s", exc)
            return 0
        for entry in entries:
            data = json.dumps(entry["event"]).encode()
            timestamp = str(entry["event"].get("timestamp", ""))
            future = self._publisher.publish(
                topic_path(CENTRAL_TOPIC), data, **{"logging.googleapis.com/timestamp": timestamp}
            )
            future.result(timeout=ADMIN_TIMEOUT)
            self._position = int(entry["seq"])
            self.published += 1
        return len(entries)


class Ticker:
    """Publishes a tick to the scheduler's topic every `every` seconds."""

    def __init__(self, publisher: Any, every: float = TICK_EVERY) -> None:
        self._publisher = publisher
        self.every = every

    def step(self) -> None:
        self._publisher.publish(topic_path(TICK_TOPIC), b"{}").result(timeout=ADMIN_TIMEOUT)


def keep_going(step: Callable[[], object], every: float, stop: threading.Event, name: str) -> threading.Thread:
    """Run `step` every `every` seconds until `stop` (sooner again while it found work)."""

    def run() -> None:
        while not stop.is_set():
            try:
                busy = step()
            except Exception:  # a failed publish is retried on the next round
                LOG.exception("%s: one round failed", name)
                busy = 0
            if not busy:
                stop.wait(every)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
