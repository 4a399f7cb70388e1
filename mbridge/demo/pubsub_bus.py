"""The demo's bus on the Pub/Sub emulator: its project, topics and subscriptions, as infra/ and
Eventarc would create them.

    agents ─► maintenance-events ─► push subscription (as Eventarc's) ─► the function
                    └─► demo-observer (pull): what the demo sees
    agents ◄─ maintenance-commands-<vm> ◄─ maintenance-commands ◄─ the function

Each VM has its own commands subscription (the emulator accepts the `target` filter but ignores
it: the agents drop other VMs' commands themselves).

The control plane's path has two topics of its own (`create_central_bus`), each pushed to its own
function: `maintenance-central`, where a log sink would route the system-event log entries, and
`maintenance-central-tick`, where Cloud Scheduler would publish once a minute.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mbridge.demo.errors import DemoSetupError
from mbridge.demo.eventarc_shim import PUSH_ACK_DEADLINE
from mbridge.demo.flows import AZURE_VMS, GCE_VM

PROJECT = "mbridge-demo"
EVENTS_TOPIC = "maintenance-events"
COMMANDS_TOPIC = "maintenance-commands"
# Eventarc names the push subscription of a trigger eventarc-REGION-TRIGGER-sub-NNN.
TRIGGER_SUBSCRIPTION = "eventarc-local-mbridge-events-sub-000"
OBSERVER_SUBSCRIPTION = "demo-observer"
CENTRAL_TOPIC = "maintenance-central"
TICK_TOPIC = "maintenance-central-tick"
ADMIN_TIMEOUT = 10.0


def topic_path(name: str) -> str:
    return f"projects/{PROJECT}/topics/{name}"


def subscription_path(name: str) -> str:
    return f"projects/{PROJECT}/subscriptions/{name}"


def admin_clients() -> tuple[Any, Any]:
    """A Pub/Sub publisher and subscriber on the emulator the environment names."""
    import google.cloud.pubsub_v1 as pubsub_v1  # type: ignore[import-untyped]  # the library ships no py.typed

    return pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()


def create_bus(publisher: Any, subscriber: Any, push_endpoint: str) -> None:
    """The topics, the trigger's push subscription to `push_endpoint`, the observer's and each VM's."""
    with setting_up("create the Pub/Sub topics and subscriptions on the emulator"):
        for topic in (EVENTS_TOPIC, COMMANDS_TOPIC):
            publisher.create_topic(name=topic_path(topic), timeout=ADMIN_TIMEOUT)
        subscriptions: list[dict[str, Any]] = [
            {"name": OBSERVER_SUBSCRIPTION, "topic": EVENTS_TOPIC},
            {
                "name": TRIGGER_SUBSCRIPTION,
                "topic": EVENTS_TOPIC,
                "push_config": {"push_endpoint": push_endpoint},
                "ack_deadline_seconds": PUSH_ACK_DEADLINE,
            },
            *(
                {"name": f"{COMMANDS_TOPIC}-{vm}", "topic": COMMANDS_TOPIC, "filter": f'attributes.target = "{vm}"'}
                for vm in (*AZURE_VMS, GCE_VM)
            ),
        ]
        for request in subscriptions:
            subscriber.create_subscription(
                request={**request, "name": subscription_path(request["name"]), "topic": topic_path(request["topic"])},
                timeout=ADMIN_TIMEOUT,
            )


@contextmanager
def setting_up(what: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        raise DemoSetupError(f"could not {what}: {exc}") from exc


def create_central_bus(publisher: Any, subscriber: Any, log_entry_endpoint: str, tick_endpoint: str) -> None:
    """The sink's topic and the scheduler's, each with a push subscription to its function."""
    with setting_up("create the control plane's topics and subscriptions on the emulator"):
        for topic, endpoint in ((CENTRAL_TOPIC, log_entry_endpoint), (TICK_TOPIC, tick_endpoint)):
            publisher.create_topic(name=topic_path(topic), timeout=ADMIN_TIMEOUT)
            subscriber.create_subscription(
                request={
                    "name": subscription_path(f"{topic}-push"),
                    "topic": topic_path(topic),
                    "push_config": {"push_endpoint": endpoint},
                    "ack_deadline_seconds": PUSH_ACK_DEADLINE,
                },
                timeout=ADMIN_TIMEOUT,
            )
