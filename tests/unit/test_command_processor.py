"""The agent's command processor and ledger, with in-memory fakes of IMDS and /readyz.

Every path of docs/contracts.md#what-the-agent-checks: what is accepted, what is rejected and why, replay, holding until
execute_at, expiry at execution time, transient IMDS failures, and restarts on the same ledger.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agent.commands import (
    RETRY_DELAY,
    CommandLedger,
    CommandProcessor,
    CommandRetryableError,
    EntryState,
    LedgerError,
)
from agent.sources.azure.client import ApprovalRefusedError
from agent.sources.azure.document import ScheduledEventsDocument, parse_scheduled_events
from agent.sources.http import MetadataUnavailableError
from agent.state_files import StateDirError
from tests.kit import FakeClock, RecordingReadiness
from tests.unit.agent.full_disk import no_room_to_grow, write_until_it_fails
from wire.commands import Command, CommandType, canonical_bytes, encode_command, new_command
from wire.errors import RetryableError
from wire.model import Cloud, CommandResult
from wire.signing import generate_keypair, load_private_key, load_public_key, sign, sign_command
from wire.tracecontext import TRACEPARENT, new_trace

VM = "WestNO_0"
EVENT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
START = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


class Crash(Exception):
    """Stands for the agent process dying at this point."""


@dataclass
class FakeImds:
    """Scheduled Events as an in-memory document. An approval starts the event, as Azure does."""

    events: list[dict[str, Any]] = field(default_factory=list)
    posts: list[str] = field(default_factory=list)
    fetches: int = 0
    fetch_failures: int = 0
    post_failures: int = 0
    refuse_posts: bool = False
    crash_on_fetch: bool = False
    crash_after_post: bool = False

    def add(self, event_id: str = EVENT_ID, status: str = "Scheduled", resources: tuple[str, ...] = (VM,)) -> None:
        self.events.append(
            {
                "EventId": event_id,
                "EventType": "Freeze",
                "ResourceType": "VirtualMachine",
                "Resources": list(resources),
                "EventStatus": status,
                "NotBefore": "Wed, 01 May 2024 12:15:00 GMT",
                "Description": "",
                "EventSource": "Platform",
                "DurationInSeconds": 5,
            }
        )

    def fetch_document(self) -> ScheduledEventsDocument:
        self.fetches += 1
        if self.crash_on_fetch:
            raise Crash("killed while reading the document")
        if self.fetch_failures:
            self.fetch_failures -= 1
            raise MetadataUnavailableError("server_error", "GET scheduledevents: 503", 503)
        return parse_scheduled_events(json.dumps({"DocumentIncarnation": 1, "Events": self.events}))

    def post_approval(self, event_id: str) -> None:
        if self.post_failures:
            self.post_failures -= 1
            raise MetadataUnavailableError("timeout", "POST scheduledevents: no answer in time")
        self.posts.append(event_id)
        if self.refuse_posts:
            raise ApprovalRefusedError(f"IMDS refused the approval of {event_id}: 400 bad request")
        for event in self.events:
            if event["EventId"].lower() == event_id.lower():
                event["EventStatus"] = "Started"
        if self.crash_after_post:
            raise Crash("killed right after the POST")


@dataclass
class Harness:
    path: Path
    clock: FakeClock
    imds: FakeImds
    readiness: RecordingReadiness
    ignored: list[str]
    ledgers: list[CommandLedger] = field(default_factory=list)

    def processor(
        self,
        *,
        cloud: Cloud = Cloud.AZURE,
        approver: bool = True,
        verify_key: Ed25519PublicKey | None = None,
        dry_run: bool = False,
    ) -> CommandProcessor:
        """A processor on the harness's ledger file; calling it again is an agent restart."""
        ledger = CommandLedger(self.path, clock=self.clock)
        self.ledgers.append(ledger)
        return CommandProcessor(
            vm_name=VM,
            cloud=cloud,
            ledger=ledger,
            readiness=self.readiness,
            approver=self.imds if approver else None,
            verify_key=verify_key,
            dry_run=dry_run,
            clock=self.clock,
            on_ignored=self.ignored.append,
        )

    def ledger(self) -> CommandLedger:
        return self.ledgers[-1]


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path / "commands.db", FakeClock(START), FakeImds(), RecordingReadiness(), [])
    yield h
    for ledger in h.ledgers:
        ledger.close()


@pytest.fixture(scope="module")
def keys() -> tuple[Ed25519PrivateKey, Ed25519PublicKey]:
    private_pem, public_pem = generate_keypair()
    return load_private_key(private_pem), load_public_key(public_pem)


def command(
    command_type: CommandType = CommandType.APPROVE,
    *,
    target: str = VM,
    event_id: str = EVENT_ID,
    issued_at: datetime = START,
    execute_in: float | None = None,
    expires_in: float = 600,
) -> Command:
    return new_command(
        command_type,
        target=target,
        event_id=event_id,
        issued_at=issued_at,
        execute_at=None if execute_in is None else issued_at + timedelta(seconds=execute_in),
        expires_at=issued_at + timedelta(seconds=expires_in),
    )


def wire(cmd: Command) -> bytes:
    return encode_command(cmd)


# ---- drain and restore


def test_drain_flips_readiness_and_is_accepted(harness: Harness) -> None:
    # GIVEN a drain command for this VM
    cmd = command(CommandType.DRAIN)

    # WHEN it is handled
    result = harness.processor().handle(wire(cmd))

    # THEN /readyz goes unready, naming the command, and the result says so
    assert result == CommandResult(cmd.command_id, True, EVENT_ID, VM, "drained: /readyz now reports unready")
    assert harness.readiness.calls == [(True, f"drain command {cmd.command_id} (event {EVENT_ID})")]


def test_restore_flips_readiness_back(harness: Harness) -> None:
    cmd = command(CommandType.RESTORE)
    result = harness.processor().handle(wire(cmd))
    assert result is not None
    assert result.accepted
    assert harness.readiness.calls == [(False, f"restore command {cmd.command_id} (event {EVENT_ID})")]


# ---- approve: accepted


def test_valid_approve_posts_once_and_is_accepted(harness: Harness) -> None:
    # GIVEN a Scheduled event for this VM
    harness.imds.add()
    cmd = command()

    # WHEN the approve command is handled
    result = harness.processor().handle(wire(cmd))

    # THEN exactly one POST, with IMDS's EventId, and an accepted result stored in the ledger
    assert harness.imds.posts == [EVENT_ID]
    assert result == CommandResult(cmd.command_id, True, EVENT_ID, VM, f"approved: StartRequests POSTed for {EVENT_ID}")
    entry = harness.ledger().get(cmd.command_id)
    assert entry is not None
    assert entry.state is EntryState.DONE
    assert entry.result == result
    assert entry.attempts == 1


def test_event_ids_compare_case_insensitively_and_the_post_uses_imds_spelling(harness: Harness) -> None:
    # GIVEN IMDS prints the GUID in upper case and the command carries it in lower case
    harness.imds.add()
    result = harness.processor().handle(wire(command(event_id=EVENT_ID.lower())))

    # THEN it is the same event; the POST carries the id as IMDS printed it
    assert result is not None
    assert result.accepted
    assert harness.imds.posts == [EVENT_ID]


def test_dry_run_accepts_without_posting(harness: Harness) -> None:
    harness.imds.add()
    result = harness.processor(dry_run=True).handle(wire(command()))
    assert result is not None
    assert result.accepted
    assert result.reason == f"dry run: would have approved {EVENT_ID}"
    assert harness.imds.posts == []


# ---- approve: rejected, and IMDS never sees a POST


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("absent", f"event {EVENT_ID} is not in the current Scheduled Events document"),
        ("started", f"event {EVENT_ID} is already Started"),
        ("other-vm", f"this VM is not in Resources of event {EVENT_ID} (WestNO_0 not in WestNO_1)"),
        ("other-event", f"event {EVENT_ID} is not in the current Scheduled Events document"),
    ],
)
def test_approve_is_rejected_unless_the_fresh_document_shows_it_scheduled_for_this_vm(
    harness: Harness, setup: str, reason: str
) -> None:
    # GIVEN a document where the event is missing, Started, or not for this VM
    if setup == "started":
        harness.imds.add(status="Started")
    elif setup == "other-vm":
        harness.imds.add(resources=("WestNO_1",))
    elif setup == "other-event":
        harness.imds.add(event_id="0B1C2D3E-4F50-4617-8A9B-C0D1E2F30415")

    # WHEN the approve command is handled
    result = harness.processor().handle(wire(command()))

    # THEN it is rejected with the reason, after a fresh GET, and nothing was POSTed
    assert result is not None
    assert not result.accepted
    assert result.reason.startswith(reason)
    assert harness.imds.fetches == 1
    assert harness.imds.posts == []


def test_approve_on_gce_is_rejected_without_touching_metadata(harness: Harness) -> None:
    harness.imds.add()
    result = harness.processor(cloud=Cloud.GCE).handle(wire(command()))
    assert result is not None
    assert result.reason == "GCE has no in-VM approval; the function uses instances.performMaintenance"
    assert (harness.imds.fetches, harness.imds.posts) == (0, [])


def test_approve_without_an_approver_is_rejected(harness: Harness) -> None:
    result = harness.processor(approver=False).handle(wire(command()))
    assert result is not None
    assert not result.accepted
    assert "no Scheduled Events client" in result.reason


def test_imds_refusal_is_a_rejection_with_its_answer(harness: Harness) -> None:
    # GIVEN IMDS answers 400 to the POST
    harness.imds.add()
    harness.imds.refuse_posts = True

    result = harness.processor().handle(wire(command()))

    # THEN the result carries IMDS's answer, and it is final
    assert result is not None
    assert not result.accepted
    assert result.reason == f"IMDS refused the approval of {EVENT_ID}: 400 bad request"
    entry = harness.ledger().get(result.command_id)
    assert entry is not None
    assert entry.result == result


# ---- receipt checks


def test_malformed_command_is_rejected_under_a_derived_id(harness: Harness) -> None:
    # GIVEN a body that is not a command
    body = b'{"command_id": "x", "type": "reboot"}'

    result = harness.processor().handle(body)

    # THEN the rejection uses "malformed-" + 16 hex of SHA-256 of the body, and names the problem
    assert result == CommandResult(
        command_id="malformed-" + hashlib.sha256(body).hexdigest()[:16],
        accepted=False,
        event_id="unknown",
        target=VM,
        reason="malformed command: target is missing: every command carries command_id, type, target, event_id, "
        "issued_at, expires_at",
    )
    assert harness.imds.fetches == 0


def test_malformed_command_naming_another_vm_is_left_to_that_vm(harness: Harness) -> None:
    result = harness.processor().handle(b'{"target": "WestNO_1", "type": "reboot"}')
    assert result is None
    assert harness.ignored == ["other_target"]


def test_command_for_another_vm_is_ignored_and_counted(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN an approve command for another VM, whose event this VM sees too
    harness.imds.add(resources=(VM, "WestNO_1"))
    cmd = command(target="WestNO_1")

    # WHEN this VM's agent receives it (the emulator ignores subscription filters)
    with caplog.at_level(logging.INFO, logger="mbridge.commands"):
        result = harness.processor().handle(wire(cmd))

    # THEN no answer, nothing done, nothing remembered; it is logged and counted
    assert result is None
    assert (harness.imds.fetches, harness.imds.posts) == (0, [])
    assert harness.ledger().get(cmd.command_id) is None
    assert harness.ignored == ["other_target"]
    assert any("addressed to WestNO_1, not to this VM" in r.getMessage() for r in caplog.records)


def test_unsigned_command_is_rejected_when_a_key_is_configured(
    harness: Harness, keys: tuple[Ed25519PrivateKey, Ed25519PublicKey]
) -> None:
    harness.imds.add()
    result = harness.processor(verify_key=keys[1]).handle(wire(command()))
    assert result is not None
    assert not result.accepted
    assert result.reason.startswith("unsigned: ")
    assert harness.imds.fetches == 0


def test_signed_command_is_executed(harness: Harness, keys: tuple[Ed25519PrivateKey, Ed25519PublicKey]) -> None:
    harness.imds.add()
    result = harness.processor(verify_key=keys[1]).handle(wire(sign_command(command(), keys[0])))
    assert result is not None
    assert result.accepted
    assert harness.imds.posts == [EVENT_ID]


def test_a_forgery_neither_executes_nor_blocks_the_genuine_command(
    harness: Harness, keys: tuple[Ed25519PrivateKey, Ed25519PublicKey]
) -> None:
    # GIVEN a genuine signed command, and a forgery reusing its id with a forged signature
    harness.imds.add()
    genuine = sign_command(command(), keys[0])
    forged = json.loads(wire(genuine))
    forged["event_id"] = "0B1C2D3E-4F50-4617-8A9B-C0D1E2F30415"
    processor = harness.processor(verify_key=keys[1])

    # WHEN the forgery arrives first
    refused = processor.handle(json.dumps(forged).encode())

    # THEN it is rejected as a bad signature and not remembered, so the genuine command still runs
    assert refused is not None
    assert refused.reason.startswith("bad signature: ")
    assert harness.ledger().get(genuine.command_id) is None
    accepted = processor.handle(wire(genuine))
    assert accepted is not None
    assert accepted.accepted
    assert harness.imds.posts == [EVENT_ID]


# ---- replay


def test_replay_returns_the_identical_stored_result_and_executes_nothing(harness: Harness) -> None:
    # GIVEN an approve that was executed
    harness.imds.add()
    cmd = command()
    processor = harness.processor()
    first = processor.handle(wire(cmd))

    # WHEN the bus redelivers it, also re-serialised with other whitespace
    again = processor.handle(wire(cmd))
    relaid = processor.handle(json.dumps(cmd.to_wire(), indent=1).encode())

    # THEN the same result (same id, same reason) comes back and IMDS saw one POST
    assert first is not None
    assert again == first
    assert relaid == first
    assert harness.imds.posts == [EVENT_ID]
    assert harness.imds.fetches == 1


def test_reused_command_id_with_other_content_is_rejected_and_keeps_the_original(harness: Harness) -> None:
    # GIVEN an executed drain
    cmd = command(CommandType.DRAIN)
    processor = harness.processor()
    original = processor.handle(wire(cmd))

    # WHEN another command arrives under the same id
    impostor = Command(
        command_id=cmd.command_id,
        type=CommandType.RESTORE,
        target=VM,
        event_id=EVENT_ID,
        issued_at=cmd.issued_at,
        expires_at=cmd.expires_at,
    )
    result = processor.handle(wire(impostor))

    # THEN it is rejected, not executed, and the original result is still what a replay gets
    assert result == CommandResult(cmd.command_id, False, EVENT_ID, VM, "command_id reused with different content")
    assert [drained for drained, _ in harness.readiness.calls] == [True]
    assert processor.handle(wire(cmd)) == original


# ---- expiry


def test_expired_command_is_rejected_and_remembered(harness: Harness) -> None:
    # GIVEN a command that expired a second ago
    harness.imds.add()
    cmd = command(issued_at=START - timedelta(minutes=10, seconds=1))

    result = harness.processor().handle(wire(cmd))

    # THEN it is rejected as expired, IMDS is not asked, and a replay gets the same answer
    assert result is not None
    assert result.reason == "expired: expires_at 2024-05-01T11:59:59Z has passed (now 2024-05-01T12:00:00Z)"
    assert harness.imds.fetches == 0
    assert harness.processor().handle(wire(cmd)) == result


def test_expiry_is_inclusive(harness: Harness) -> None:
    # GIVEN now == expires_at
    cmd = command(issued_at=START - timedelta(minutes=10))
    result = harness.processor().handle(wire(cmd))
    assert result is not None
    assert result.reason.startswith("expired")


# ---- held commands


def test_held_command_runs_when_its_time_comes(harness: Harness) -> None:
    # GIVEN an approve to execute in 30 s
    harness.imds.add()
    cmd = command(execute_in=30)
    processor = harness.processor()

    # WHEN it is received
    assert processor.handle(wire(cmd)) is None

    # THEN it is held: listed, due at its time, and nothing happens before that
    assert harness.ledger().held() == [cmd]
    assert processor.next_due_at() == START + timedelta(seconds=30)
    harness.clock.advance(29)
    assert processor.run_due() == []
    assert processor.handle(wire(cmd)) is None  # a redelivery while held is not an answer
    assert harness.imds.fetches == 0

    # WHEN its time comes
    harness.clock.advance(1)
    results = processor.run_due()

    # THEN it executes once, and is no longer held
    assert [r.accepted for r in results] == [True]
    assert harness.imds.posts == [EVENT_ID]
    assert harness.ledger().held() == []
    assert processor.next_due_at() is None
    assert processor.run_due() == []
    assert processor.handle(wire(cmd)) == results[0]


def test_held_command_expired_at_execution_time_is_rejected(harness: Harness) -> None:
    # GIVEN a held approve that expires 60 s after issue
    harness.imds.add()
    cmd = command(execute_in=30, expires_in=60)
    processor = harness.processor()
    assert processor.handle(wire(cmd)) is None

    # WHEN the agent only gets to it after expiry (it was stalled)
    harness.clock.advance(61)
    results = processor.run_due()

    # THEN it is rejected as expired, without asking IMDS
    assert len(results) == 1
    assert results[0].reason.startswith("expired: ")
    assert (harness.imds.fetches, harness.imds.posts) == (0, [])


def test_held_command_retries_later_when_imds_is_unavailable(harness: Harness) -> None:
    # GIVEN a held approve, and IMDS failing the first GET
    harness.imds.add()
    harness.imds.fetch_failures = 1
    cmd = command(execute_in=30)
    processor = harness.processor()
    processor.handle(wire(cmd))
    harness.clock.advance(30)

    # WHEN it comes due
    assert processor.run_due() == []

    # THEN it is held again RETRY_DELAY later, with no result, and succeeds then
    assert processor.next_due_at() == START + timedelta(seconds=30) + RETRY_DELAY
    entry = harness.ledger().get(cmd.command_id)
    assert entry is not None
    assert entry.result is None
    harness.clock.advance(RETRY_DELAY.total_seconds())
    assert [r.accepted for r in processor.run_due()] == [True]
    assert harness.imds.posts == [EVENT_ID]


# ---- transient IMDS failures on receipt


@pytest.mark.parametrize("failure", ["fetch", "post"])
def test_unavailable_imds_leaves_no_final_result_and_the_redelivery_executes(harness: Harness, failure: str) -> None:
    # GIVEN IMDS failing the GET or the POST once
    harness.imds.add()
    if failure == "fetch":
        harness.imds.fetch_failures = 1
    else:
        harness.imds.post_failures = 1
    cmd = command()
    processor = harness.processor()

    # WHEN the command is handled
    with pytest.raises(CommandRetryableError, match="leave the command unsettled"):
        processor.handle(wire(cmd))

    # THEN no final result is recorded (the message stays unsettled)
    entry = harness.ledger().get(cmd.command_id)
    assert entry is not None
    assert entry.state is EntryState.EXECUTING
    assert entry.result is None

    # WHEN the bus redelivers it
    result = processor.handle(wire(cmd))

    # THEN it is re-validated and POSTed once
    assert result is not None
    assert result.accepted
    assert harness.imds.posts == [EVENT_ID]


# ---- restarts


def test_restart_does_not_execute_a_finished_command_again(harness: Harness) -> None:
    # GIVEN an approve that was executed before the agent restarted
    harness.imds.add()
    cmd = command()
    first = harness.processor().handle(wire(cmd))
    harness.ledger().close()

    # WHEN a new agent on the same ledger file gets the redelivery
    again = harness.processor().handle(wire(cmd))

    # THEN it answers with the stored result; IMDS saw one GET and one POST
    assert again == first
    assert (harness.imds.fetches, harness.imds.posts) == (1, [EVENT_ID])


def test_restart_after_a_crash_right_after_the_post_does_not_post_again(harness: Harness) -> None:
    # GIVEN the agent died after POSTing, before storing the result
    harness.imds.add()
    harness.imds.crash_after_post = True
    cmd = command()
    with pytest.raises(Crash):
        harness.processor().handle(wire(cmd))
    harness.imds.crash_after_post = False

    # WHEN a new agent starts on the same ledger
    restarted = harness.processor()
    results = restarted.run_due()

    # THEN it re-validated against a fresh document: the event Started, so no second POST
    assert harness.imds.posts == [EVENT_ID]
    assert len(results) == 1
    assert results[0].reason == (
        f"event {EVENT_ID} is already Started (an earlier attempt of this command may have approved it)"
    )
    # AND the redelivery gets that stored answer
    assert restarted.handle(wire(cmd)) == results[0]


def test_restart_after_a_crash_before_the_post_posts_exactly_once(harness: Harness) -> None:
    # GIVEN the agent died while reading the document (after recording "executing")
    harness.imds.add()
    harness.imds.crash_on_fetch = True
    cmd = command()
    with pytest.raises(Crash):
        harness.processor().handle(wire(cmd))
    harness.imds.crash_on_fetch = False

    # WHEN a new agent starts, and the bus redelivers the command
    restarted = harness.processor()
    assert restarted.handle(wire(cmd)) is None  # already re-queued: the due run answers
    results = restarted.run_due()

    # THEN it is executed once
    assert [r.accepted for r in results] == [True]
    assert harness.imds.posts == [EVENT_ID]
    assert restarted.run_due() == []


def test_held_command_survives_a_restart(harness: Harness) -> None:
    # GIVEN a drain held for 30 s when the agent restarted (its bus message already settled)
    cmd = command(CommandType.DRAIN, execute_in=30)
    assert harness.processor().handle(wire(cmd)) is None

    # WHEN the new agent reaches that time
    restarted = harness.processor()
    assert restarted.next_due_at() == START + timedelta(seconds=30)
    harness.clock.advance(30)

    # THEN it drains then, once
    assert [r.accepted for r in restarted.run_due()] == [True]
    assert [drained for drained, _ in harness.readiness.calls] == [True]


# ---- the ledger itself


def test_ledger_uses_wal(harness: Harness) -> None:
    harness.processor()
    with sqlite3.connect(harness.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_prune_keeps_ids_as_long_as_a_replay_could_pass_the_expiry_check(harness: Harness) -> None:
    # GIVEN a finished short-lived command and a finished command that is valid for two days
    short = command(CommandType.DRAIN)
    long_lived = command(CommandType.RESTORE, expires_in=2 * 24 * 3600)
    processor = harness.processor()
    processor.handle(wire(short))
    processor.handle(wire(long_lived))

    # WHEN more than the retention (24 h) passes and the ledger prunes
    harness.clock.advance(25 * 3600)
    removed = harness.ledger().prune()

    # THEN only the expired one is forgotten; the other still answers a replay with its stored result
    assert removed == 1
    assert harness.ledger().get(short.command_id) is None
    assert harness.ledger().get(long_lived.command_id) is not None
    assert [d for d, _ in harness.readiness.calls] == [True, False]
    replay = processor.handle(wire(long_lived))
    assert replay is not None
    assert replay.accepted
    assert [d for d, _ in harness.readiness.calls] == [True, False]


def test_recent_finished_entries_survive_the_prune_on_open(harness: Harness) -> None:
    cmd = command(CommandType.DRAIN, expires_in=60)
    harness.processor().handle(wire(cmd))
    harness.clock.advance(3600)  # expired, but finished only an hour ago
    harness.processor()  # a restart prunes on open
    assert harness.ledger().get(cmd.command_id) is not None


def test_a_ledger_from_a_newer_agent_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "commands.db"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(LedgerError, match="upgrade maintenance-bridge"):
        CommandLedger(path, clock=FakeClock(START))


def test_an_unusable_ledger_directory_says_what_to_fix(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StateDirError, match="--state-dir"):
        CommandLedger(tmp_path / "file" / "commands.db", clock=FakeClock(START))


def test_a_missing_ledger_directory_is_made(tmp_path: Path) -> None:
    CommandLedger(tmp_path / "missing-dir" / "commands.db", clock=FakeClock(START)).close()
    assert (tmp_path / "missing-dir" / "commands.db").is_file()


def test_a_full_disk_gives_the_command_back_for_redelivery(harness: Harness) -> None:
    # GIVEN a ledger whose disk fills up (the page limit: see tests/unit/agent/full_disk.py)
    processor = harness.processor()
    no_room_to_grow(harness.ledger()._db)

    # WHEN drain commands keep coming until one cannot be recorded
    error = write_until_it_fails(lambda n: processor.handle(wire(command(CommandType.DRAIN))))

    # THEN that one is a retryable error naming the full disk (the command loop gives the message
    # back for redelivery), not an SQLite error the loop takes for a bug
    assert isinstance(error, RetryableError), repr(error)
    assert "database or disk is full" in str(error)


def test_a_held_result_not_yet_in_the_outbox_is_reported_after_a_restart(harness: Harness) -> None:
    # GIVEN a held approve that executed, and the agent stopped before its result reached the outbox
    harness.imds.add()
    cmd = command(execute_in=30)
    processor = harness.processor()
    assert processor.handle(wire(cmd)) is None
    harness.clock.advance(30)
    (result,) = processor.run_due()
    harness.ledger().close()

    # WHEN a new agent starts on the same ledger
    restarted = harness.processor()

    # THEN the result is still to be reported, once: after mark_reported it is gone
    assert restarted.unreported() == [result]
    restarted.mark_reported([result])
    assert restarted.unreported() == []
    assert harness.processor().unreported() == []
    assert harness.imds.posts == [EVENT_ID]


# ---- what the lifecycle learns from the ledger, and a status that cannot be read


def test_an_event_whose_status_cannot_be_read_is_not_approved(harness: Harness) -> None:
    # GIVEN IMDS listing this VM's event with an EventStatus that is neither Scheduled nor Started
    harness.imds.add(status="Pending")

    # WHEN an approval arrives
    result = harness.processor().handle(wire(command()))

    # THEN it is refused and nothing is POSTed: only an event plainly Scheduled is approved
    assert result is not None
    assert not result.accepted
    assert "not Scheduled" in result.reason
    assert harness.imds.posts == []


def test_the_events_this_agent_approved_are_remembered_across_a_restart(harness: Harness) -> None:
    # GIVEN an approval POSTed by this agent, and one refused
    harness.imds.add()
    harness.imds.add(event_id="OTHER-EVENT", resources=("someone-else",))
    processor = harness.processor()
    processor.handle(wire(command()))
    processor.handle(wire(command(event_id="OTHER-EVENT")))

    # WHEN the agent restarts THEN only the approved event is known as approved, lowercased
    assert harness.processor().approved_event_ids() == frozenset({EVENT_ID.lower()})


def test_a_dry_run_approved_nothing(harness: Harness) -> None:
    harness.imds.add()
    processor = harness.processor(dry_run=True)
    processor.handle(wire(command()))
    assert processor.approved_event_ids() == frozenset()


# ---- trace context


def test_an_approval_keeps_its_trace_in_the_ledger_its_log_lines_and_its_result(
    harness: Harness, keys: tuple[Ed25519PrivateKey, Ed25519PublicKey], caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a signed approval carrying its maintenance's trace
    harness.imds.add()
    trace = new_trace()
    cmd = sign_command(
        new_command(CommandType.APPROVE, target=VM, event_id=EVENT_ID, issued_at=START, trace=trace), keys[0]
    )

    # WHEN it is carried out
    with caplog.at_level(logging.INFO, logger="mbridge.commands"):
        result = harness.processor(verify_key=keys[1]).handle(wire(cmd))

    # THEN the POST is recorded with the trace id, the result carries it on, and so do the lines
    # saying the command came and what became of it
    assert harness.imds.posts == [EVENT_ID]
    entry = harness.ledger().get(cmd.command_id)
    assert entry is not None
    assert entry.trace_id == trace.trace_id
    assert result is not None
    assert result.accepted
    assert result.trace_id == trace.trace_id
    assert entry.result is not None
    assert entry.result.trace_id == trace.trace_id
    traced = [r.getMessage() for r in caplog.records if getattr(r, "trace_id", None) == trace.trace_id]
    assert any(m.startswith("received approve command") for m in traced)
    assert any("approved: StartRequests POSTed" in m for m in traced)


def test_a_trace_context_that_is_not_one_neither_refuses_a_signed_command_nor_is_kept(
    harness: Harness, keys: tuple[Ed25519PrivateKey, Ed25519PublicKey], caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a signed approval whose sender put a traceparent that is not W3C's form
    harness.imds.add()
    document = {**command().to_wire(), TRACEPARENT: "00-" + "Z" * 52}
    document["signature"] = sign(canonical_bytes(document), keys[0])

    # WHEN it is handled
    result = harness.processor(verify_key=keys[1]).handle(json.dumps(document).encode())

    # THEN it runs as any signed command does (a trace decides nothing), the trace is ignored, and
    # the log says why
    assert result is not None
    assert result.accepted
    assert result.trace_id == ""
    assert harness.imds.posts == [EVENT_ID]
    entry = harness.ledger().get(document["command_id"])
    assert entry is not None
    assert entry.trace_id is None
    assert any("trace context that is not one" in r.getMessage() for r in caplog.records)


def test_the_signature_covers_the_trace_and_a_trace_never_stands_in_for_it(
    harness: Harness, keys: tuple[Ed25519PrivateKey, Ed25519PublicKey]
) -> None:
    # GIVEN a signed approval with a trace, the same with its traceparent changed on the way, and
    # an unsigned one with a valid trace
    harness.imds.add()
    signed = sign_command(
        new_command(CommandType.APPROVE, target=VM, event_id=EVENT_ID, issued_at=START, trace=new_trace()), keys[0]
    )
    retraced = {**signed.to_wire(), TRACEPARENT: new_trace().traceparent}
    unsigned = new_command(CommandType.APPROVE, target=VM, event_id=EVENT_ID, issued_at=START, trace=new_trace())
    processor = harness.processor(verify_key=keys[1])

    # WHEN the altered and the unsigned ones arrive
    altered = processor.handle(json.dumps(retraced).encode())
    bare = processor.handle(wire(unsigned))

    # THEN both are refused as any command whose signature does not hold, and nothing is POSTed
    assert altered is not None
    assert altered.reason.startswith("bad signature: ")
    assert bare is not None
    assert bare.reason.startswith("unsigned: ")
    assert harness.imds.posts == []
    # AND the genuine one still runs
    genuine = processor.handle(wire(signed))
    assert genuine is not None
    assert genuine.accepted


def test_a_ledger_made_before_traces_gets_their_column_and_keeps_its_commands(harness: Harness) -> None:
    # GIVEN a ledger as an agent before traces made it, holding a command
    with sqlite3.connect(harness.path) as db:
        db.executescript(_LEDGER_BEFORE_TRACES)
        db.execute("PRAGMA user_version = 1")
        cmd = command(CommandType.DRAIN, execute_in=30)
        db.execute(
            "INSERT INTO commands (command_id, digest, state, body, type, event_id, execute_at, expires_at, "
            "received_at, updated_at) VALUES (?, ?, 'held', ?, 'drain', ?, ?, ?, ?, ?)",
            (
                cmd.command_id,
                hashlib.sha256(wire(cmd)).hexdigest(),
                wire(cmd),
                EVENT_ID,
                START.timestamp() + 30,
                START.timestamp() + 600,
                START.timestamp(),
                START.timestamp(),
            ),
        )
    db.close()

    # WHEN this agent opens it and runs the held command
    processor = harness.processor()
    harness.clock.advance(30)
    (result,) = processor.run_due()

    # THEN the command runs without a trace, and the ledger keeps its schema version (an older agent
    # rolled back to reads it still)
    assert result.accepted
    assert result.trace_id == ""
    entry = harness.ledger().get(cmd.command_id)
    assert entry is not None
    assert entry.trace_id is None
    with sqlite3.connect(harness.path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (1,)
        assert "trace_id" in {row[1] for row in db.execute("PRAGMA table_info(commands)")}
    db.close()


# The ledger's schema as agents before traces made it.
_LEDGER_BEFORE_TRACES = """
CREATE TABLE commands (
    command_id  TEXT PRIMARY KEY, digest TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('held', 'executing', 'done')),
    body BLOB NOT NULL, type TEXT NOT NULL, event_id TEXT NOT NULL, execute_at REAL, expires_at REAL NOT NULL,
    received_at REAL NOT NULL, updated_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, accepted INTEGER,
    reason TEXT, result_target TEXT, result_event_id TEXT, reported INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX commands_due ON commands (state, execute_at);
"""
