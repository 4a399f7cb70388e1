"""Commands spread over several Pub/Sub topics: each command reaches the topic of its VM's shard.

The operator is the real PubSubOperator over a fake of the library's publisher (its PublisherLike
port), which records what would reach Pub/Sub; the topics of the shards are wire.shards's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from google.api_core import exceptions as api_errors

from wire.shards import entity_for
from wire.transports.base import OutboundMessage, TransportConfigError
from wire.transports.pubsub import PubSubOperator, PubSubSettings

PROJECT = "prod"


@dataclass
class Permissions:
    permissions: Sequence[str]


@dataclass
class RecordingPublisher:
    """What reaches the library: publishes by topic, IAM questions by resource."""

    published: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)
    refused: str = ""

    def publish(self, topic: str, data: bytes, ordering_key: str = "", **kwargs: Any) -> Any:
        attributes = {key: value for key, value in kwargs.items() if key not in ("retry", "timeout")}
        self.published.append((topic, ordering_key, attributes))
        return self

    def result(self, timeout: float | None = None) -> str:
        return "message-id"

    def resume_publish(self, topic: str, ordering_key: str) -> None: ...

    def get_topic(self, *, topic: str, retry: Any = None, timeout: Any = None) -> object:
        self.asked.append(topic)
        if topic == self.refused:
            raise api_errors.NotFound("no such topic")  # type: ignore[no-untyped-call]  # the library leaves it unannotated
        return object()

    def test_iam_permissions(self, *, request: Mapping[str, Any], retry: Any = None, timeout: Any = None) -> Any:
        self.asked.append(request["resource"])
        granted = [] if request["resource"] == self.refused else list(request["permissions"])
        return Permissions(granted)

    def stop(self) -> None: ...


class AnySubscriber:
    def test_iam_permissions(self, *, request: Mapping[str, Any], retry: Any = None, timeout: Any = None) -> Any:
        return Permissions(list(request["permissions"]))

    def get_subscription(self, *, subscription: str, retry: Any = None, timeout: Any = None) -> object:
        return object()

    def close(self) -> None: ...


def operator(publisher: RecordingPublisher, *, emulator: bool = False, **overrides: Any) -> PubSubOperator:
    return PubSubOperator(
        PubSubSettings(project=PROJECT, **overrides),
        publisher_factory=lambda: publisher,  # type: ignore[arg-type,return-value]  # a fake of the library's
        subscriber_factory=AnySubscriber,  # type: ignore[arg-type]
        emulator=emulator,
    )


def command(vm: str, number: int = 1) -> OutboundMessage:
    return OutboundMessage(envelope_id=f"cmd-{number}-{vm}", body=b"{}", key=vm, attributes={"type": "approve"})


def topic(name: str) -> str:
    return f"projects/{PROJECT}/topics/{name}"


def test_one_shard_publishes_every_command_on_the_configured_topic() -> None:
    publisher = RecordingPublisher()
    sender = operator(publisher)
    for vm in ("vm-0", "vm-1", "vm-2"):
        sender.send_command(command(vm))
    assert {name for name, _, _ in publisher.published} == {topic("maintenance-commands")}


def test_each_command_goes_to_the_topic_of_its_vms_shard_keyed_and_addressed_to_it() -> None:
    # GIVEN an operator over 8 commands topics
    publisher = RecordingPublisher()
    sender = operator(publisher, commands_shards=8)
    vms = [f"vm-{i}" for i in range(8)]  # shards 7, 3, 7, 4, 4, 3, 1, 0 (tests/unit/test_shards.py)
    # WHEN it sends a command to each VM
    for vm in vms:
        sender.send_command(command(vm))
    # THEN each went to its VM's shard topic, with the ordering key and the attribute `target` as before
    assert [(name, key, attributes["target"]) for name, key, attributes in publisher.published] == [
        (topic(entity_for("maintenance-commands", vm, 8)), vm, vm) for vm in vms
    ]
    assert topic("maintenance-commands-7") == publisher.published[0][0]
    assert topic("maintenance-commands") == publisher.published[7][0]


def test_a_topic_given_as_a_path_keeps_its_project_for_every_shard() -> None:
    publisher = RecordingPublisher()
    operator(publisher, commands_topic="projects/hub/topics/commands", commands_shards=8).send_command(command("vm-0"))
    assert publisher.published[0][0] == "projects/hub/topics/commands-7"


@pytest.mark.parametrize("emulator", [False, True])
def test_check_asks_about_every_shard_topic_and_names_the_one_missing(emulator: bool) -> None:
    # GIVEN an operator over 3 topics
    publisher = RecordingPublisher()
    # WHEN it checks THEN it asked about each topic, publishing nothing
    description = operator(publisher, emulator=emulator, commands_shards=3).check()
    assert publisher.asked == [
        topic("maintenance-commands"),
        topic("maintenance-commands-1"),
        topic("maintenance-commands-2"),
    ]
    assert publisher.published == []
    assert "maintenance-commands-2" in description
    # AND a topic the operator may not publish to (or missing, on the emulator) is named
    with pytest.raises(TransportConfigError, match="maintenance-commands-2"):
        operator(
            RecordingPublisher(refused=topic("maintenance-commands-2")), emulator=emulator, commands_shards=3
        ).check()


@pytest.mark.parametrize("shards", [0, 1025, True])
def test_a_shard_count_out_of_range_is_refused_naming_the_option(shards: int) -> None:
    with pytest.raises(TransportConfigError, match=r"--commands-shards.*from 1 to 1024"):
        PubSubSettings(project=PROJECT, commands_shards=shards).validate()
