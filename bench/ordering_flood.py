"""An agent's flood and the ordering of the events subscription, on Google's Pub/Sub emulator.

Every agent may publish to `maintenance-events` and chooses the ordering key of what it
publishes. Measured here: how long a VM's genuine event takes to reach the functions (from the
start of its publish to the moment an invocation takes it), alone and after `flood` junk
messages that another agent published just before it, for three designs of the events subscription:

- `ordered_vm_key`: message ordering on, ordering key = VM name (the design the drill
  tests/drills/test_ordering_flood.py found hijackable);
- `unordered_no_key`: message ordering off, no ordering key (the design chosen: docs/transports.md);
- `ordered_secret_key`: message ordering on, ordering key = VM name plus a random secret the
  agent would keep, which another agent cannot guess (it cannot read the events topic).

and two floods: `lane`, junk keyed with the victim's VM name (the attack on its ordering lane),
and `spread`, junk without a key (the flood any design lets through: it only adds to the backlog
every VM's events wait behind). The functions are played by bench/push_standin.py: `WORKERS`
invocations, `HANDLING_SECONDS` per message, Pub/Sub's push rules for ordering keys.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.context import BenchContext
from bench.peers import PeerUnavailableError, environment, start_pubsub_emulator
from bench.push_standin import PushStandIn
from bench.results import Figure

PROJECT = "mbridge-bench-ordering"
VICTIM = "gce-0"
WORKERS = 16  # invocations at once; the cloud's push scales further, which favours the unordered design
# A refusal of an unverified message (decode, no valid proof, audit) takes the functions a few
# milliseconds: the finding measured 11 s for 2,000 junk messages in one lane.
HANDLING_SECONDS = 0.005
DELIVERY_TIMEOUT = 120.0
ADMIN_TIMEOUT = 30.0


@dataclass(frozen=True)
class Design:
    name: str
    ordered: bool  # message ordering on the functions' subscription
    genuine_key: Callable[[], str]  # the ordering key the victim's agent publishes with


DESIGNS = (
    Design("ordered_vm_key", True, lambda: VICTIM),
    Design("unordered_no_key", False, lambda: ""),
    Design("ordered_secret_key", True, lambda: f"{VICTIM}.{secrets.token_hex(16)}"),
)
FLOODS: dict[str, str | None] = {"quiet": None, "lane": VICTIM, "spread": ""}  # flood → the junk's key


def run(context: BenchContext) -> list[Figure]:
    flood = context.samples(500, 2000)
    samples = context.samples(2, 5)
    try:
        emulator = start_pubsub_emulator(context.dir("ordering-pubsub"))
    except PeerUnavailableError as exc:
        return [Figure(f"ordering.{d.name}.{f}.p50", None, "ms", note=str(exc)) for d in DESIGNS for f in FLOODS]
    context.cleanup.callback(emulator.stop)
    with environment("PUBSUB_EMULATOR_HOST", emulator.host):
        return measure(flood, samples)


def measure(flood: int, samples: int) -> list[Figure]:
    import google.cloud.pubsub_v1 as pubsub_v1  # type: ignore[import-untyped]  # the library ships no py.typed

    publisher = pubsub_v1.PublisherClient(
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    subscriber = pubsub_v1.SubscriberClient()
    figures: list[Figure] = []
    try:
        for design in DESIGNS:
            for flood_name, junk_key in FLOODS.items():
                junk = 0 if junk_key is None else flood
                trials = [
                    trial(publisher, subscriber, design, junk, junk_key or "", f"{design.name}-{flood_name}-{n}")
                    for n in range(samples)
                ]
                figures.extend(trial_figures(f"ordering.{design.name}.{flood_name}", trials, junk))
    finally:
        publisher.stop()
        subscriber.close()
    return figures


def trial(publisher: Any, subscriber: Any, design: Design, junk: int, junk_key: str, name: str) -> tuple[float, int]:
    """One genuine event after `junk` junk messages: (its latency in ms, messages handled before it)."""
    topic = f"projects/{PROJECT}/topics/{name}"
    subscription = f"projects/{PROJECT}/subscriptions/{name}"
    publisher.create_topic(name=topic, timeout=ADMIN_TIMEOUT)
    subscriber.create_subscription(
        request={"name": subscription, "topic": topic, "enable_message_ordering": design.ordered},
        timeout=ADMIN_TIMEOUT,
    )
    functions = PushStandIn(
        subscriber, subscription, ordered=design.ordered, workers=WORKERS, handling_seconds=HANDLING_SECONDS
    )
    functions.start()
    try:
        futures = [publisher.publish(topic, b'{"junk": %d}' % n, ordering_key=junk_key) for n in range(junk)]
        for future in futures:
            future.result(timeout=ADMIN_TIMEOUT)
        started = time.monotonic()
        publisher.publish(topic, b'{"genuine": true}', ordering_key=design.genuine_key(), genuine="1").result(
            timeout=ADMIN_TIMEOUT
        )
        if not functions.delivered.wait(DELIVERY_TIMEOUT):
            raise TimeoutError(f"{name}: the genuine event was not delivered within {DELIVERY_TIMEOUT:g} s")
        return (functions.delivered_at - started) * 1000, functions.handled_before_delivery
    finally:
        functions.stop()
        subscriber.delete_subscription(subscription=subscription, timeout=ADMIN_TIMEOUT)
        publisher.delete_topic(topic=topic, timeout=ADMIN_TIMEOUT)


def trial_figures(name: str, trials: list[tuple[float, int]], junk: int) -> list[Figure]:
    latencies = [latency for latency, _ in trials]
    handled = [count for _, count in trials]
    note = f"{junk} junk messages published just before it" if junk else "no flood"
    count = len(trials)
    return [
        Figure(f"{name}.p50", statistics.median(latencies), "ms", note=note, samples=count),
        Figure(f"{name}.max", max(latencies), "ms", note=note, samples=count),
        Figure(f"{name}.handled_before", statistics.median(handled), "count", note=note, samples=count),
    ]
