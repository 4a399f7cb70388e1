"""Commands through a real bus into the real agent and on to the simulated IMDS.

Whatever arrives — malformed, for another VM, expired, unsigned, signed with the wrong key,
replayed — only the one valid approval reaches IMDS: the simulator's approval log proves it.
Runs on the embedded local bus and on Google's Pub/Sub emulator.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from agent.config import AgentSettings
from simulator import Simulator
from tests.agent_runner import AgentThread, settings_for
from tests.waiting import wait_until
from wire.commands import Command, CommandType, encode_command, new_command
from wire.envelope import decode
from wire.model import CommandResult
from wire.signing import generate_keypair, load_private_key, sign_command
from wire.transports.base import OutboundMessage

VM = "vm-0"
EVENT_ID = "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"


@dataclass
class Bus:
    """How the test reaches the agent: send raw commands, read result envelopes."""

    send: Callable[[OutboundMessage], None]
    read: Callable[[float], list[bytes]]
    settings: Callable[[AgentSettings], AgentSettings]


@pytest.fixture(params=["local", "pubsub"])
def bus(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Bus]:
    if request.param == "local":
        from wire.transports.local import LocalBus, LocalOperator

        path = tmp_path / "bus.db"
        local = LocalOperator(LocalBus(path))
        yield Bus(
            local.send_command,
            lambda wait: list(local.read_results(wait)),
            lambda s: replace(s, transport="local", bus_path=path),
        )
        return
    request.getfixturevalue("pubsub_emulator")
    import google.cloud.pubsub_v1 as pubsub_v1  # type: ignore[import-untyped]

    from wire.transports.pubsub import PubSubOperator, PubSubSettings

    project = f"e2e-{uuid.uuid4().hex[:8]}"
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    for topic, subscriptions in (
        ("maintenance-events", ["operator-results"]),
        ("maintenance-commands", [f"maintenance-commands-{VM}"]),
    ):
        publisher.create_topic(name=f"projects/{project}/topics/{topic}")
        for name in subscriptions:
            subscriber.create_subscription(
                request={
                    "name": f"projects/{project}/subscriptions/{name}",
                    "topic": f"projects/{project}/topics/{topic}",
                    "enable_message_ordering": True,
                    "ack_deadline_seconds": 30,
                }
            )
    operator = PubSubOperator(PubSubSettings(project=project, vm_name=VM, operation_timeout=10.0))
    yield Bus(
        operator.send_command,
        lambda wait: list(operator.read_results(wait)),
        lambda s: replace(s, transport="pubsub", pubsub_project=project),
    )
    operator.close()


def message(command: Command | None, body: bytes | None = None, key: str = VM) -> OutboundMessage:
    payload = body if body is not None else encode_command(command)  # type: ignore[arg-type]
    command_id = command.command_id if command else uuid.uuid4().hex
    return OutboundMessage(envelope_id=command_id, body=payload, key=key, attributes={"type": "approve"})


def approve(now: datetime, **overrides: Any) -> Command:
    fields: dict[str, Any] = {"target": VM, "event_id": EVENT_ID, "issued_at": now}
    fields.update(overrides)
    return new_command(CommandType.APPROVE, **fields)


def test_only_the_valid_signed_approval_reaches_imds(
    bus: Bus, tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    # GIVEN a scheduled event for vm-0, and its agent requiring commands signed by the functions' key
    private_pem, public_pem = generate_keypair()
    key = load_private_key(private_pem)
    intruder = load_private_key(generate_keypair()[0])
    with Simulator(cloud="azure", vm_names=[VM]) as sim:
        requests.post(
            f"{sim.base_urls[0]}/_sim/events",
            # keep_serving: the VM stays reachable after the approval starts its deletion, to be checked
            json={"event_type": "Terminate", "resources": [VM], "event_id": EVENT_ID, "keep_serving": True},
            timeout=5,
        ).raise_for_status()
        settings = bus.settings(settings_for("azure", sim.base_urls[0], VM, tmp_path))
        agent_thread(replace(settings, verify_key=public_pem.decode()))
        now = datetime.now(timezone.utc)

        # WHEN every kind of bad command arrives, then the valid one, then the valid one again
        unsigned = approve(now)
        forged = sign_command(approve(now), intruder)
        expired = sign_command(approve(now - timedelta(minutes=20)), key)
        other_vm = sign_command(approve(now, target="vm-9"), key)
        valid = sign_command(approve(now), key)
        for bad in (unsigned, forged, expired, other_vm):
            bus.send(message(bad))
        bus.send(message(None, body=b'{"command_id": "x", "type": "approve"'))
        bus.send(message(valid))
        bus.send(message(valid))  # a replay (or a redelivery): answered again, never executed again

        # THEN one answer per command addressed to vm-0 (none for vm-9's) ...
        results: dict[str, CommandResult] = {}

        def collect() -> bool:
            for body in bus.read(1.0):
                data = decode(body).data
                if isinstance(data, CommandResult):
                    results[data.command_id] = data
            return len(results) >= 5

        wait_until(collect, 60, lambda: f"5 results, got {sorted(results)}")
        approvals = sim.approvals()
        state = requests.get(f"{sim.base_urls[0]}/_sim/events", timeout=5).json()

    assert other_vm.command_id not in results
    assert results[valid.command_id].accepted, results[valid.command_id]
    rejected = {cid: r.reason for cid, r in results.items() if not r.accepted}
    assert set(rejected) >= {unsigned.command_id, forged.command_id, expired.command_id}
    assert any(cid.startswith("malformed-") for cid in rejected)
    assert "unsigned" in rejected[unsigned.command_id]
    assert "signature" in rejected[forged.command_id]
    assert "expired" in rejected[expired.command_id]
    # ... and IMDS saw exactly one POST: the valid approval, from vm-0
    assert [(a["event_ids"], a["status"]) for a in approvals] == [([EVENT_ID], 200)]
    assert [e["sim"]["approved_by"] for e in state] == [VM]


def test_events_reach_pubsub_unkeyed_in_lifecycle_order_with_attributes(
    pubsub_emulator: str, tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    import google.cloud.pubsub_v1 as pubsub_v1

    from simulator import load_scenario
    from tests.agent_runner import play_to_the_end
    from wire.transports.pubsub import EVENTS_SUBSCRIPTION_ORDERED

    # GIVEN the events topic with a subscription as the functions' one is deployed, and the agent publishing to it
    project = f"events-{uuid.uuid4().hex[:8]}"
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = f"projects/{project}/topics/maintenance-events"
    subscription = f"projects/{project}/subscriptions/functions"
    publisher.create_topic(name=topic)
    subscriber.create_subscription(
        request={
            "name": subscription,
            "topic": topic,
            "enable_message_ordering": EVENTS_SUBSCRIPTION_ORDERED,
            "ack_deadline_seconds": 30,
        }
    )
    with Simulator(scenario=load_scenario("azure-live-migration")) as sim:
        settings = settings_for("azure", sim.base_urls[0], "WestNO_0", tmp_path)
        agent = agent_thread(replace(settings, transport="pubsub", pubsub_project=project))

        # WHEN the documented live migration plays
        play_to_the_end(sim)
        received: list[Any] = []

        def pulled_three() -> bool:
            response = subscriber.pull(subscription=subscription, max_messages=10, timeout=2, retry=None)
            received.extend(response.received_messages)
            if response.received_messages:
                subscriber.acknowledge(
                    subscription=subscription, ack_ids=[m.ack_id for m in response.received_messages]
                )
            return len(received) >= 3

        wait_until(pulled_three, 30, lambda: f"3 messages, got {len(received)}")
        agent.halt()

    # THEN three messages, published in lifecycle order (the agent publishes the next once the bus
    # stored the last), without an ordering key, with the attributes of docs/contracts.md#on-the-bus
    messages = sorted((m.message for m in received), key=lambda message: message.publish_time)
    assert [m.attributes["type"].rsplit(".", 1)[1] for m in messages] == ["scheduled", "started", "completed"]
    assert {m.ordering_key for m in messages} == {""}
    assert {(m.attributes["vm"], m.attributes["cloud"], m.attributes["event_id"]) for m in messages} == {
        ("WestNO_0", "azure", "C7061BAC-AFDC-4513-B24B-AA5F13A16123")
    }
    assert [decode(m.data).id for m in messages] == [m.attributes["envelope_id"] for m in messages]


def test_mbridge_approve_exit_codes_over_the_local_bus(
    tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    import subprocess
    import sys

    from tests.agent_runner import ROOT

    # GIVEN vm-0's agent on the local bus and a scheduled event for it
    with Simulator(cloud="azure", vm_names=[VM]) as sim:
        requests.post(
            f"{sim.base_urls[0]}/_sim/events",
            json={"event_type": "Reboot", "resources": [VM], "event_id": EVENT_ID},
            timeout=5,
        ).raise_for_status()
        settings = replace(settings_for("azure", sim.base_urls[0], VM, tmp_path), transport="local")
        agent_thread(settings)
        # the operator trusts this run's metadata service, as it would trust Azure's
        trust = tmp_path / "trust.json"
        trust.write_text(json.dumps(sim.trust()), encoding="utf-8")

        def approve_cli(event_id: str, target: str, wait: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "mbridge.cli", "approve", "--event-id", event_id, "--target", target,
                 "--transport", "local", "--bus-path", str(settings.bus_path), "--wait", wait,
                 "--trust-file", str(trust)],
                capture_output=True, text=True, timeout=60, cwd=ROOT,
            )  # fmt: skip

        # WHEN an operator approves the event, an unknown event, and an event on a VM with no agent
        accepted = approve_cli(EVENT_ID, VM, "20")
        rejected = approve_cli("00000000-0000-0000-0000-000000000000", VM, "20")
        unanswered = approve_cli(EVENT_ID, "vm-without-agent", "1")
        approvals = sim.approvals()

    # THEN 0 accepted, 1 rejected with the reason, 2 no answer; IMDS saw the one valid approval
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert rejected.returncode == 1, rejected.stdout + rejected.stderr
    assert "not in the current Scheduled Events document" in rejected.stdout
    assert unanswered.returncode == 2, unanswered.stdout + unanswered.stderr
    assert [(a["event_ids"], a["status"]) for a in approvals] == [([EVENT_ID], 200)]
