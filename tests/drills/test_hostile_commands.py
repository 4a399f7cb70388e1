"""Drill 5: 1,000 hostile commands through a real agent's command channel, with a real event waiting.

`mbridge agent` runs as a process on the embedded bus with a verification key, while the simulator
holds a Reboot of its VM in Scheduled: one valid approval would start it. The drill sends 1,000
forged, mis-targeted, expired, replayed and malformed commands (a seeded mix) onto the agent's
command queue, as any sender on the bus could. IMDS's approval log counts every POST it receives,
and the agent's outbox (which keeps each result it published) shows what the agent answered.

Builds on tests/contract/test_commands_against_simulator.py (one command of each kind, handed to
the processor in-process): here the running agent, its bus, 1,000 commands, replays with new bus
message ids, forgeries that front-run the genuine command's id, and the proof that the channel still
works afterwards.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from simulator import Simulator
from tests.agent_runner import AgentProcess
from tests.drills.conftest import drill_seed, say
from tests.waiting import wait_until
from wire.commands import Command, CommandType, encode_command, new_command
from wire.envelope import decode
from wire.model import CommandResult
from wire.signing import generate_keypair, load_private_key, load_public_key, public_key_text, sign_command
from wire.transports.base import OutboundMessage
from wire.transports.local import LocalBus

pytestmark = [pytest.mark.drill, pytest.mark.timeout(60)]

SEED = 20261122
COMMANDS = 1000
VM, OTHER_VM = "vm-0", "vm-1"
EVENT_ID = "5B7A8C1D-2E3F-4A5B-8C7D-9E0F1A2B3C4D"


@dataclass(frozen=True)
class Sent:
    kind: str
    body: bytes
    answer: str | None  # the rejection's reason starts with this; None: no answer (another VM's)
    command_id: str  # the command_id its result carries


@dataclass
class Keys:
    genuine: Ed25519PrivateKey
    attacker: Ed25519PrivateKey
    verify: str  # the public key as the agent's --verify-key takes it


def keys() -> Keys:
    genuine_pem, public_pem = generate_keypair()
    attacker_pem, _ = generate_keypair()
    return Keys(
        load_private_key(genuine_pem), load_private_key(attacker_pem), public_key_text(load_public_key(public_pem))
    )


def malformed_id(body: bytes) -> str:
    """The id the agent answers a malformed command under (docs/commands.md)."""
    return "malformed-" + hashlib.sha256(body).hexdigest()[:16]


class Forge:
    """Builds the hostile commands, all aimed at the Scheduled event (one slip would approve it)."""

    def __init__(self, rng: random.Random, keys: Keys, final_id: str) -> None:
        self.rng = rng
        self.keys = keys
        self.final_id = final_id  # the genuine approval sent last; forgeries front-run its id
        self.answered: list[Sent] = []  # earlier commands a replay may repeat

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def command(self, *, target: str = VM, age: float = 0.0, command_id: str | None = None) -> Command:
        return new_command(
            CommandType.APPROVE,
            target=target,
            event_id=EVENT_ID,
            issued_at=self.now() - timedelta(seconds=age),
            command_id=command_id,
        )

    def signed(self, command: Command, key: Ed25519PrivateKey | None = None) -> dict[str, Any]:
        document: dict[str, Any] = sign_command(command, key or self.keys.genuine).to_wire()
        return document

    def make(self, kind: str) -> Sent:
        build = getattr(self, "_" + kind.replace("-", "_"))
        sent: Sent = build()
        if sent.answer is not None:
            self.answered.append(sent)
        return sent

    # ---- forged: bad signature

    def _signed_by_another_key(self) -> Sent:
        command_id = self.final_id if self.rng.random() < 0.2 else None
        document = self.signed(self.command(command_id=command_id), self.keys.attacker)
        return Sent("forged", _json(document), "bad signature: ", document["command_id"])

    def _tampered(self) -> Sent:
        # A genuine signature over another command, the fields then changed to aim at the event.
        document = self.signed(self.command(target=OTHER_VM))
        document["target"] = VM
        if self.rng.random() < 0.5:
            document["expires_at"] = (self.now() + timedelta(days=365)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return Sent("forged", _json(document), "bad signature: ", document["command_id"])

    def _garbage_signature(self) -> Sent:
        document = self.signed(self.command())
        size = self.rng.choice([0, 1, 63, 64, 65, 100])
        noise = base64.urlsafe_b64encode(self.rng.randbytes(size)).decode().rstrip("=")
        document["signature"] = noise or "!"
        return Sent("forged", _json(document), "bad signature: ", document["command_id"])

    # ---- unsigned, mis-targeted, expired

    def _unsigned(self) -> Sent:
        document = self.command(command_id=self.final_id if self.rng.random() < 0.2 else None).to_wire()
        return Sent("unsigned", _json(document), "unsigned: ", document["command_id"])

    def _mis_targeted(self) -> Sent:
        # Genuinely signed, for the other VM of the set, but delivered to this VM's queue.
        document = self.signed(self.command(target=OTHER_VM))
        return Sent("mis-targeted", _json(document), None, document["command_id"])

    def _expired(self) -> Sent:
        document = self.signed(self.command(age=self.rng.uniform(601, 86_400)))
        return Sent("expired", _json(document), "expired: ", document["command_id"])

    # ---- replayed

    def _replayed(self) -> Sent:
        if not self.answered or self.rng.random() < 0.4:
            return self._reused_id()
        # The very bytes of an earlier command, under a new bus message id: the same answer again.
        earlier = self.rng.choice(self.answered)
        return Sent("replayed", earlier.body, earlier.answer, earlier.command_id)

    def _reused_id(self) -> Sent:
        # An expired command's id, with fresh, genuinely signed content for the Scheduled event: only
        # the ledger stands between this and an approval.
        earlier = [sent for sent in self.answered if sent.kind == "expired"]
        if not earlier:
            return self._expired()
        command_id = self.rng.choice(earlier).command_id
        document = self.signed(self.command(command_id=command_id))
        return Sent("replayed", _json(document), "command_id reused with different content", command_id)

    # ---- malformed

    def _malformed(self) -> Sent:
        document = self.signed(self.command())
        how = self.rng.choice(MALFORMATIONS)
        body = how(self.rng, document)
        return Sent("malformed", body, "malformed command: ", malformed_id(body))


def _json(document: Any) -> bytes:
    return json.dumps(document).encode()


def _unknown_field(rng: random.Random, document: dict[str, Any]) -> bytes:
    return _json({**document, rng.choice(["force", "priority", "note", "Signature"]): True})


def _missing_field(rng: random.Random, document: dict[str, Any]) -> bytes:
    name = rng.choice(["command_id", "type", "event_id", "issued_at", "expires_at"])
    return _json({key: value for key, value in document.items() if key != name})


def _wrong_type(rng: random.Random, document: dict[str, Any]) -> bytes:
    name = rng.choice(["command_id", "event_id", "issued_at", "expires_at", "signature"])
    return _json({**document, name: rng.choice([1, 2.5, True, [], {}, ""])})


def _unknown_type(rng: random.Random, document: dict[str, Any]) -> bytes:
    return _json({**document, "type": rng.choice(["start-now", "APPROVE", "approve ", "reboot", None])})


def _bad_time(rng: random.Random, document: dict[str, Any]) -> bytes:
    name = rng.choice(["issued_at", "expires_at", "execute_at"])
    text = rng.choice(["yesterday", "2024-13-01T00:00:00Z", "2024-05-01 12:00", "1714560000", "2024-05-01T12:00:00"])
    return _json({**document, name: text})


def _times_out_of_order(rng: random.Random, document: dict[str, Any]) -> bytes:
    if rng.random() < 0.5:
        return _json({**document, "expires_at": document["issued_at"]})
    return _json({**document, "execute_at": "2999-01-01T00:00:00Z"})


def _not_an_object(rng: random.Random, document: dict[str, Any]) -> bytes:
    return rng.choice([b"", b"null", b"[]", b'"approve"', b"42", b"{", b"\xff\xfe", _json([document])])


def _too_large(rng: random.Random, document: dict[str, Any]) -> bytes:
    return _json({**document, "signature": "A" * (64 * 1024 + rng.randint(0, 100))})


def _twice(rng: random.Random, document: dict[str, Any]) -> bytes:
    text = _json(document)[:-1].decode()
    return (text + f', "event_id": "{rng.choice(["X", EVENT_ID])}"}}').encode()


def _control_characters(rng: random.Random, document: dict[str, Any]) -> bytes:
    name = rng.choice(["command_id", "event_id"])
    return _json({**document, name: document[name] + rng.choice(["\n", "\x00", "\x1b[2J", "\x7f"])})


def _long_id(rng: random.Random, document: dict[str, Any]) -> bytes:
    return _json({**document, "command_id": "c" * rng.randint(129, 4000)})


MALFORMATIONS = [
    _unknown_field,
    _missing_field,
    _wrong_type,
    _unknown_type,
    _bad_time,
    _times_out_of_order,
    _not_an_object,
    _too_large,
    _twice,
    _control_characters,
    _long_id,
]
KINDS = ["signed-by-another-key", "tampered", "garbage-signature", "unsigned", "mis-targeted", "expired"]
KINDS += ["replayed", "malformed"]


# ---------------------------------------------------------------------------------------- helpers


def send(bus: LocalBus, body: bytes, target: str = VM) -> None:
    """Put one message on `target`'s command queue under a bus message id of its own."""
    assert bus.send_command(OutboundMessage(envelope_id=uuid.uuid4().hex, body=body, key=target))


def results(state_dir: Path) -> list[CommandResult]:
    """Every command result the agent published, in order (its outbox keeps them)."""
    path = state_dir / "agent.db"
    if not path.exists():
        return []
    with sqlite3.connect(path, timeout=5) as db:
        rows = db.execute("SELECT body FROM outbox WHERE attributes LIKE '%command.%' ORDER BY seq").fetchall()
    found = []
    for (body,) in rows:
        data = decode(bytes(body)).data
        assert isinstance(data, CommandResult)
        found.append(data)
    return found


def start_agent(
    agent_process: Callable[[list[str]], AgentProcess], sim: Simulator, tmp_path: Path, verify: str
) -> tuple[AgentProcess, LocalBus]:
    bus_path = tmp_path / "bus.db"
    agent = agent_process(["--cloud", "azure", "--metadata-url", sim.base_urls[0], "--vm-name", VM,
                           "--transport", "local", "--bus-path", str(bus_path), "--state-dir", str(tmp_path / "state"),
                           "--verify-key", verify, "--listen", "off", "--poll-interval", "0.25"])  # fmt: skip
    wait_until(bus_path.exists, 20, lambda: f"the agent's bus; agent log: {agent.log()[-2000:]}")
    bus = LocalBus(bus_path)
    # the agent is up once the Scheduled event is on the bus
    wait_until(lambda: bus.last_event_seq() >= 1, 20, lambda: f"the event on the bus; log: {agent.log()[-1500:]}")
    return agent, bus


def scheduled_event(sim: Simulator) -> None:
    body = {"event_type": "Reboot", "event_id": EVENT_ID, "resources": [VM, OTHER_VM], "notice": 3600}
    requests.post(f"{sim.base_urls[0]}/_sim/events", json=body, timeout=5).raise_for_status()


def event_status(sim: Simulator) -> str:
    events = requests.get(f"{sim.base_urls[0]}/_sim/events", timeout=5).json()
    return str(next(e["EventStatus"] for e in events if e["EventId"] == EVENT_ID))


# ---------------------------------------------------------------------------------------- the drills


def test_a_thousand_hostile_commands_approve_nothing_and_each_gets_its_rejection(
    tmp_path: Path, agent_process: Callable[[list[str]], AgentProcess]
) -> None:
    started = time.monotonic()
    seed = drill_seed(SEED)
    rng = random.Random(seed)
    pair = keys()
    final_id = uuid.uuid4().hex
    with Simulator(cloud="azure", vm_names=[VM, OTHER_VM]) as sim:
        # GIVEN a Reboot of this VM, Scheduled for an hour: one valid approval would start it
        scheduled_event(sim)
        # AND the agent running with a verification key, its commands on the embedded bus
        agent, bus = start_agent(agent_process, sim, tmp_path, pair.verify)
        state_dir = tmp_path / "state"

        # WHEN 1,000 forged, mis-targeted, expired, replayed and malformed commands arrive
        forge = Forge(rng, pair, final_id)
        sent = [forge.make(rng.choice(KINDS)) for _ in range(COMMANDS)]
        for command in sent:
            send(bus, command.body)
        answered = [command for command in sent if command.answer is not None]
        wait_until(
            lambda: len(results(state_dir)) >= len(answered) and not bus.open_commands(VM, limit=1),
            40,
            lambda: f"{len(answered)} answers, got {len(results(state_dir))} (seed {seed})",
        )
        answers = results(state_dir)
        hostile_posts = sim.approvals()
        status_after_hostile = event_status(sim)
        hostile_seconds = time.monotonic() - started

        # AND then the genuine approval, whose id the forgeries tried to take first, and three replays of it
        genuine = encode_command(sign_command(forge.command(command_id=final_id), pair.genuine))
        for _ in range(4):
            send(bus, genuine)
        wait_until(lambda: len(results(state_dir)) >= len(answers) + 4, 20, "the genuine approval's answers")
        finals = results(state_dir)[len(answers) :]
        posts = sim.approvals()
        agent_log = agent.log()
        bus.close()

    # THEN IMDS saw no POST while the 1,000 arrived, and the event was still Scheduled
    assert hostile_posts == [], f"{hostile_posts} (seed {seed})"
    assert status_after_hostile == "Scheduled"
    # ... every command got one answer, a rejection with its reason, in the order sent (the
    # mis-targeted ones excepted: another VM's command gets no answer from this one, by design)
    assert len(answers) == len(answered), f"{len(answers)} answers for {len(answered)} commands (seed {seed})"
    for command, answer in zip(answered, answers):
        assert (answer.command_id, answer.accepted) == (command.command_id, False), f"{command} (seed {seed})"
        assert answer.reason.startswith(command.answer or "?"), f"{command.kind}: {answer.reason} (seed {seed})"
    # ... and none stayed on the queue to come back
    ignored = sum(1 for command in sent if command.answer is None)
    assert agent_log.count("it is addressed to vm-1, not to this VM") == ignored
    # AND the genuine approval was accepted once and POSTed once; its replays got the same answer
    assert [(r.command_id, r.accepted) for r in finals] == [(final_id, True)] * 4, finals
    assert [(p["vm"], p["status"]) for p in posts] == [(VM, 200)]
    kinds = Counter(command.kind for command in sent)
    say(
        "hostile-commands",
        seed=seed,
        commands=len(sent),
        kinds=dict(kinds),
        rejections=len(answers),
        ignored_other_vm=ignored,
        reasons=dict(Counter(answer.reason.split(":")[0].split(" (")[0][:40] for answer in answers)),
        posts_while_hostile=len(hostile_posts),
        hostile_s=round(hostile_seconds, 1),
        duration_s=round(time.monotonic() - started, 1),
    )


def test_a_poisonous_command_is_rejected_and_does_not_hold_up_the_next(
    tmp_path: Path, agent_process: Callable[[list[str]], AgentProcess]
) -> None:
    pair = keys()
    with Simulator(cloud="azure", vm_names=[VM, OTHER_VM]) as sim:
        scheduled_event(sim)
        _, bus = start_agent(agent_process, sim, tmp_path, pair.verify)
        # GIVEN two commands no decoder should choke on, then a genuine drain
        nested = b"[" * 50_000
        surrogate = _json({"command_id": "c1", "type": "approve", "target": VM, "event_id": "\ud800",
                           "issued_at": "2026-01-01T00:00:00Z", "expires_at": "2026-01-01T00:10:00Z"})  # fmt: skip
        drain = new_command(CommandType.DRAIN, target=VM, event_id=EVENT_ID, issued_at=datetime.now(timezone.utc))
        # WHEN they arrive together
        for body in (nested, surrogate, encode_command(sign_command(drain, pair.genuine))):
            send(bus, body)
        # THEN the two are rejected as malformed and the drain is accepted
        try:
            wait_until(lambda: len(results(tmp_path / "state")) >= 3, 30, "three answers")
        finally:
            bus.close()
        answers = {result.command_id: result for result in results(tmp_path / "state")}
        assert not answers[malformed_id(nested)].accepted
        assert not answers[malformed_id(surrogate)].accepted
        assert answers[drain.command_id].accepted
