"""Commands against the real metadata simulator over HTTP, through the real AzureImdsClient.

The simulator's approval log records every POST attempt, so "never reached IMDS" is asserted on
what the metadata service saw, not on what the agent says it did.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agent.commands import CommandLedger, CommandProcessor
from agent.sources.azure.client import AzureImdsClient
from agent.timing import SystemClock
from simulator import Simulator
from tests.contract.simulator.conftest import VmClient
from tests.kit import RecordingReadiness
from wire.commands import Command, CommandType, encode_command, new_command
from wire.model import Cloud
from wire.signing import generate_keypair, load_private_key, load_public_key, sign_command

VM = "vm-0"
OTHER_VM = "vm-1"
EVENT_ID = "0B1C2D3E-4F50-4617-8A9B-C0D1E2F30415"


@dataclass
class Rig:
    sim: Simulator
    vm: VmClient
    processor: CommandProcessor
    private_key: Ed25519PrivateKey
    clock: SystemClock

    def command(self, *, target: str = VM, event_id: str = EVENT_ID, age: float = 0) -> Command:
        return new_command(
            CommandType.APPROVE,
            target=target,
            event_id=event_id,
            issued_at=self.clock.now() - timedelta(seconds=age),
        )

    def signed(self, command: Command) -> bytes:
        return encode_command(sign_command(command, self.private_key))

    def posts(self) -> list[dict[str, object]]:
        return self.sim.approvals()


@pytest.fixture(scope="module")
def keys() -> tuple[Ed25519PrivateKey, Ed25519PublicKey]:
    private_pem, public_pem = generate_keypair()
    return load_private_key(private_pem), load_public_key(public_pem)


@contextmanager
def make_rig(
    tmp_path: Path, keys: tuple[Ed25519PrivateKey, Ed25519PublicKey], *, dry_run: bool = False
) -> Iterator[Rig]:
    sim = Simulator(cloud="azure", vm_names=[VM, OTHER_VM])
    sim.start()
    client = AzureImdsClient.for_base_url(sim.base_urls[0])
    clock = SystemClock()
    ledger = CommandLedger(tmp_path / "commands.db", clock=clock)
    try:
        vm = VmClient(sim.base_urls[0])
        # Tests read and write faster than a real client; the 5 requests/s limit has tests of its own.
        vm.post_ok("faults", {"rate_limit": False})
        processor = CommandProcessor(
            vm_name=VM,
            cloud=Cloud.AZURE,
            ledger=ledger,
            readiness=RecordingReadiness(),
            approver=client,
            verify_key=keys[1],
            dry_run=dry_run,
            clock=clock,
        )
        yield Rig(sim=sim, vm=vm, processor=processor, private_key=keys[0], clock=clock)
    finally:
        ledger.close()
        client.close()
        sim.stop()


@pytest.fixture
def rig(tmp_path: Path, keys: tuple[Ed25519PrivateKey, Ed25519PublicKey]) -> Iterator[Rig]:
    """GIVEN a simulator serving vm-0 and vm-1, and vm-0's command processor with a verification key."""
    with make_rig(tmp_path, keys) as started:
        yield started


def event_status(vm: VmClient, event_id: str = EVENT_ID) -> str | None:
    for event in vm.events()["Events"]:
        if event["EventId"].lower() == event_id.lower():
            return str(event["EventStatus"])
    return None


def test_a_valid_approve_reaches_imds_exactly_once_and_starts_the_event(rig: Rig) -> None:
    # GIVEN a Scheduled Reboot for vm-0 and vm-1
    rig.vm.add_event(event_type="Reboot", event_id=EVENT_ID, resources=[VM, OTHER_VM])
    body = rig.signed(rig.command())

    # WHEN vm-0's agent handles a signed approve, and the bus redelivers it
    result = rig.processor.handle(body)
    replay = rig.processor.handle(body)

    # THEN IMDS saw exactly one POST, from vm-0, accepted
    assert result is not None
    assert result.accepted, result.reason
    assert replay == result
    posts = rig.posts()
    assert len(posts) == 1
    assert posts[0]["vm"] == VM
    assert posts[0]["status"] == 200
    assert posts[0]["outcome"] == "accepted"
    event_ids = posts[0]["event_ids"]
    assert isinstance(event_ids, list)
    assert [event_id.lower() for event_id in event_ids] == [EVENT_ID.lower()]

    # AND the event starts (3 documented seconds after the approval)
    rig.sim.advance_clock(5)
    assert event_status(rig.vm) == "Started"


def _forged(rig: Rig) -> bytes:
    document = json.loads(rig.signed(rig.command(event_id="SOME-OTHER-EVENT")))
    document["event_id"] = EVENT_ID  # re-aimed at the real event; the signature no longer matches
    return json.dumps(document).encode()


def _unsigned(rig: Rig) -> bytes:
    return encode_command(rig.command())


def _mis_targeted(rig: Rig) -> bytes:
    return rig.signed(rig.command(target=OTHER_VM))


def _expired(rig: Rig) -> bytes:
    return rig.signed(rig.command(age=601))


def _malformed(rig: Rig) -> bytes:
    document = json.loads(rig.signed(rig.command()))
    document["type"] = "start-now"
    return json.dumps(document).encode()


def _unknown_field(rig: Rig) -> bytes:
    document = json.loads(rig.signed(rig.command()))
    document["force"] = True
    return json.dumps(document).encode()


REFUSED: dict[str, tuple[Callable[[Rig], bytes], str | None]] = {
    "forged": (_forged, "bad signature: "),
    "unsigned": (_unsigned, "unsigned: "),
    "mis-targeted": (_mis_targeted, None),
    "expired": (_expired, "expired: "),
    "malformed": (_malformed, "malformed command: type must be one of"),
    "unknown-field": (_unknown_field, "malformed command: unknown field(s) force"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_commands_never_reach_imds(rig: Rig, case: str) -> None:
    # GIVEN a Scheduled event that vm-0 could approve
    rig.vm.add_event(event_type="Reboot", event_id=EVENT_ID, resources=[VM, OTHER_VM])
    build, reason = REFUSED[case]

    # WHEN vm-0's agent receives the bad command
    result = rig.processor.handle(build(rig))

    # THEN it is rejected with its reason (or not answered, when it is another VM's)
    if reason is None:
        assert result is None
    else:
        assert result is not None
        assert not result.accepted
        assert result.reason.startswith(reason), result.reason
    # AND the metadata service never saw a POST, and the event is still waiting
    assert rig.posts() == []
    assert event_status(rig.vm) == "Scheduled"


def test_an_event_this_vm_is_not_in_is_never_approved(rig: Rig) -> None:
    # GIVEN an event that vm-0 sees (Azure broadcasts to the set) but that concerns vm-1 only
    rig.vm.add_event(event_type="Redeploy", event_id=EVENT_ID, resources=[OTHER_VM])

    result = rig.processor.handle(rig.signed(rig.command()))

    assert result is not None
    assert result.reason.startswith(f"this VM is not in Resources of event {EVENT_ID}")
    assert rig.posts() == []


def test_an_already_started_event_is_never_posted(rig: Rig) -> None:
    # GIVEN a hardware-failure Reboot: added already Started
    rig.vm.add_event(event_type="Reboot", event_id=EVENT_ID, status="Started", resources=[VM])

    result = rig.processor.handle(rig.signed(rig.command()))

    assert result is not None
    assert result.reason == f"event {EVENT_ID} is already Started"
    assert rig.posts() == []


def test_an_unknown_event_is_never_posted(rig: Rig) -> None:
    # GIVEN nothing scheduled at all
    result = rig.processor.handle(rig.signed(rig.command()))

    assert result is not None
    assert result.reason.startswith(f"event {EVENT_ID} is not in the current Scheduled Events document")
    assert rig.posts() == []


def test_a_replay_after_the_event_started_gets_the_stored_answer_without_a_post(rig: Rig) -> None:
    # GIVEN an approve that was executed, and the event has started since
    rig.vm.add_event(event_type="Reboot", event_id=EVENT_ID, resources=[VM])
    body = rig.signed(rig.command())
    first = rig.processor.handle(body)
    rig.sim.advance_clock(5)
    assert event_status(rig.vm) == "Started"

    # WHEN the same command arrives again
    again = rig.processor.handle(body)

    # THEN the answer is the stored "accepted", and still only one POST reached IMDS
    assert again == first
    assert len(rig.posts()) == 1


def test_dry_run_never_posts(tmp_path: Path, keys: tuple[Ed25519PrivateKey, Ed25519PublicKey]) -> None:
    # GIVEN an agent in dry-run mode and a Scheduled event for it
    with make_rig(tmp_path, keys, dry_run=True) as rig:
        rig.vm.add_event(event_type="Reboot", event_id=EVENT_ID, resources=[VM])

        # WHEN a valid approve arrives
        result = rig.processor.handle(rig.signed(rig.command()))

        # THEN it reports what it would have done, and IMDS saw no POST
        assert result is not None
        assert result.reason == f"dry run: would have approved {EVENT_ID}"
        assert rig.posts() == []
