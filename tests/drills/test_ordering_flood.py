"""Drill: an agent floods another VM's ordering lane on the Pub/Sub emulator (tests/peers.py starts it).

Any identity that may publish to `maintenance-events` (every agent) chooses the ordering key of
what it publishes. On a subscription with message ordering on, Pub/Sub hands a key's messages
over in order and the next ones only once the earlier ones are acknowledged: junk published under
a victim's VM name queues in front of the victim's genuine event, and each junk message, though
the functions refuse it as unverified, must be handled before the genuine one comes.

The drill publishes `FLOOD` junk messages keyed with the victim's name, then the victim's genuine
event through the agent's own transport, on a subscription created as infra/ creates the
functions' one. The consumer stands in for the functions: it takes what the subscription hands
over and handles (acknowledges) the junk it holds only when nothing more comes. Done when the
genuine event reaches it before the flood has been handled — a position, not a duration: with an
ordering lane it comes exactly after all `FLOOD` junk messages were handled, however fast the
machine is.

It failed while events were keyed with the VM's name on an ordered subscription (all 300 junk
messages were handled first); events now carry no ordering key and the subscription has ordering
off (docs/transports.md#why-events-carry-no-ordering-key).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1  # type: ignore[import-untyped]  # the library ships no py.typed
import pytest
from google.api_core import exceptions as api_errors

from tests.drills.conftest import say
from wire.transports.base import OutboundMessage
from wire.transports.pubsub import EVENTS_SUBSCRIPTION_ORDERED, PubSubSettings, PubSubTransport

pytestmark = [pytest.mark.peer, pytest.mark.drill, pytest.mark.timeout(60)]

VICTIM = "gce-0"
FLOOD = 300
PULL_BATCH = 100  # fewer than the flood: an ordering lane then needs acknowledgements to go on
# How long a pull waits before the consumer counts the subscription as having nothing more for
# now: the emulator holds an empty pull to its deadline, and answers at once when it has messages.
IDLE_PULL_SECONDS = 2.0
FUNCTIONS_SUBSCRIPTION = "maintenance-events-functions"


@pytest.fixture
def project(pubsub_emulator: str) -> Iterator[str]:
    """A project of this drill's own on the shared emulator, with the events topic and the functions' subscription."""
    name = f"mbridge-flood-{uuid.uuid4().hex[:12]}"
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = f"projects/{name}/topics/maintenance-events"
    publisher.create_topic(name=topic)
    subscriber.create_subscription(
        request={
            "name": f"projects/{name}/subscriptions/{FUNCTIONS_SUBSCRIPTION}",
            "topic": topic,
            # As infra/terraform/gcp/pubsub.tf creates it (tests/infra checks the two agree).
            "enable_message_ordering": EVENTS_SUBSCRIPTION_ORDERED,
            "ack_deadline_seconds": 600,  # as deployed: nothing held is redelivered during the drill
        }
    )
    yield name
    subscriber.close()


def publish_junk(project: str, count: int, ordering_key: str) -> None:
    """What a compromised agent can do with its publisher role: messages keyed as it likes, no valid proof."""
    attacker = pubsub_v1.PublisherClient(
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    topic = f"projects/{project}/topics/maintenance-events"
    attributes = {"type": "org.maintenancebridge.maintenance.scheduled", "vm": ordering_key, "cloud": "gce"}
    futures = [
        attacker.publish(
            topic, b'{"junk": %d}' % number, ordering_key=ordering_key, event_id=f"junk-{number}", **attributes
        )
        for number in range(count)
    ]
    for future in futures:
        future.result(timeout=60)
    attacker.stop()


def genuine_event() -> OutboundMessage:
    envelope_id = uuid.uuid4().hex * 2
    return OutboundMessage(
        envelope_id=envelope_id,
        body=b'{"id": "%s", "genuine": true}' % envelope_id.encode(),
        key=VICTIM,
        attributes={
            "type": "org.maintenancebridge.maintenance.scheduled",
            "vm": VICTIM,
            "cloud": "gce",
            "event_id": "genuine",
        },
    )


def junk_handled_before(subscriber: Any, subscription: str, envelope_id: str) -> int:
    """Take what `subscription` hands over until the message with `envelope_id` comes; hold the junk,
    and handle (acknowledge) all of it held only when nothing more comes. Returns how many junk
    messages had been handled when the genuine one came."""
    handled = 0
    held: list[str] = []
    for _ in range(FLOOD + 10):  # each round takes or handles at least one message, or fails
        try:
            response = subscriber.pull(
                subscription=subscription, max_messages=PULL_BATCH, timeout=IDLE_PULL_SECONDS, retry=None
            )
            received = list(response.received_messages)
        except api_errors.DeadlineExceeded:
            received = []
        for item in received:
            if item.message.attributes.get("envelope_id") == envelope_id:
                return handled
            held.append(item.ack_id)
        if not received:
            assert held, f"the subscription has nothing more, and the genuine event never came ({handled} handled)"
            subscriber.acknowledge(subscription=subscription, ack_ids=held, timeout=30)
            handled += len(held)
            held = []
    raise AssertionError(f"the genuine event did not come in {FLOOD + 10} rounds ({handled} junk handled)")


def test_junk_keyed_with_a_victims_name_does_not_hold_up_its_genuine_event(project: str) -> None:
    # GIVEN FLOOD junk messages that an agent published under the victim's VM name
    publish_junk(project, FLOOD, ordering_key=VICTIM)
    # WHEN the victim's agent publishes its genuine event after them
    transport = PubSubTransport(PubSubSettings(project=project, vm_name=VICTIM, operation_timeout=30.0))
    event = genuine_event()
    try:
        transport.publish(event)
    finally:
        transport.close()
    # THEN the functions get it before they have handled the flood
    subscriber = pubsub_v1.SubscriberClient()
    try:
        handled = junk_handled_before(
            subscriber, f"projects/{project}/subscriptions/{FUNCTIONS_SUBSCRIPTION}", event.envelope_id
        )
    finally:
        subscriber.close()
    say("ordering-flood", flood=FLOOD, junk_handled_before_the_genuine_event=handled)
    assert handled < FLOOD, (
        f"the genuine event of {VICTIM} came only after all {handled} junk messages keyed {VICTIM!r} were handled"
    )
