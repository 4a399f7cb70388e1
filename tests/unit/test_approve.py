"""`mbridge approve`: what it sends, how it waits, and its exit codes, with in-memory bus fakes."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mbridge import approve_cli
from mbridge.approve import run_approve
from tests.factories import azure_event
from tests.identity import ProofsOfTest, proven
from tests.kit import FakeClock
from wire.commands import CommandType, decode_command
from wire.envelope import encode, envelope_for_command_result, envelope_for_event
from wire.identity import IdentityVerifier
from wire.model import Cloud, CommandResult
from wire.signing import generate_keypair, load_private_key, load_public_key, verify
from wire.transports.base import OutboundMessage, TransportUnavailableError

VM = "WestNO_0"
EVENT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
START = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)

Answer = Callable[[str], list[bytes]]


@dataclass
class FakeSender:
    sent: list[OutboundMessage] = field(default_factory=list)
    fail: bool = False

    def send_command(self, message: OutboundMessage) -> None:
        if self.fail:
            raise TransportUnavailableError("the bus refused the message: 503")
        self.sent.append(message)


class FakeAgentOnTheBus:
    """A results reader whose envelopes are produced from what the sender sent.

    `answer(command_id) -> list of envelope bodies` decides what the channel carries once the
    command is out; each read takes `max_wait` of the fake clock when nothing is left.
    """

    def __init__(self, clock: FakeClock, sender: FakeSender, answer: Answer) -> None:
        self._clock = clock
        self._sender = sender
        self._answer = answer
        self._queue: list[bytes] | None = None
        self.reads: list[float] = []

    def read_results(self, max_wait: float) -> Sequence[bytes]:
        self.reads.append(max_wait)
        if self._queue is None:
            command_id = decode_command(self._sender.sent[-1].body).command.command_id
            self._queue = list(self._answer(command_id))
        if not self._queue:
            self._clock.advance(max_wait)
            return []
        batch, self._queue = self._queue[:2], self._queue[2:]
        return batch


def result_body(
    command_id: str, accepted: bool, reason: str, target: str = VM, proven_by: str | None = "target"
) -> bytes:
    """A result envelope as an agent publishes it, proven by `proven_by` (the target by default; None: no proof)."""
    result = CommandResult(command_id=command_id, accepted=accepted, event_id=EVENT_ID, target=target, reason=reason)
    envelope = envelope_for_command_result(result, Cloud.AZURE, START)
    if proven_by is None:
        return encode(envelope)
    return proven(envelope, by=target if proven_by == "target" else proven_by)


def run(
    sender: FakeSender,
    clock: FakeClock,
    out: io.StringIO,
    reader: FakeAgentOnTheBus | None,
    wait: float | None = 30,
    signing_key: Ed25519PrivateKey | None = None,
    cloud: Cloud = Cloud.AZURE,
    verifier: IdentityVerifier | None = None,
    trace: str | None = None,
) -> int:
    return run_approve(
        event_id=EVENT_ID,
        target=VM,
        cloud=cloud,
        sender=sender,
        reader=reader,
        wait=wait,
        signing_key=signing_key,
        verifier=verifier if verifier is not None else ProofsOfTest(),
        clock=clock,
        out=out,
        trace=trace,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def sender() -> FakeSender:
    return FakeSender()


@pytest.fixture
def out() -> io.StringIO:
    return io.StringIO()


def test_no_wait_sends_one_approve_command_and_prints_its_id(
    sender: FakeSender, clock: FakeClock, out: io.StringIO
) -> None:
    # WHEN approve runs with --no-wait
    code = run(sender, clock, out, reader=None, wait=None)

    # THEN one command went out, addressed to the target, and only its id is printed
    assert code == 0
    (message,) = sender.sent
    command = decode_command(message.body).command
    assert out.getvalue() == f"{command.command_id}\n"
    assert message.envelope_id == command.command_id
    assert message.key == VM
    assert dict(message.attributes) == {"type": "approve", "target": VM, "event_id": EVENT_ID}
    assert (command.type, command.target, command.event_id) == (CommandType.APPROVE, VM, EVENT_ID)
    assert command.issued_at == START
    assert command.expires_at == START + timedelta(minutes=10)
    assert command.signature is None


def test_a_signing_key_signs_the_command(sender: FakeSender, clock: FakeClock, out: io.StringIO) -> None:
    # GIVEN the operator's signing key
    private_pem, public_pem = generate_keypair()

    run(sender, clock, out, reader=None, wait=None, signing_key=load_private_key(private_pem))

    # THEN the command carries a signature the agents' public key verifies
    received = decode_command(sender.sent[0].body)
    assert received.command.signature is not None
    verify(received.canonical, received.command.signature, load_public_key(public_pem))


def test_a_command_carries_the_trace_the_operator_gives_and_none_without(
    sender: FakeSender, clock: FakeClock, out: io.StringIO
) -> None:
    # GIVEN the event's trace id, as its audit records show it, and the operator's signing key
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    private_pem, public_pem = generate_keypair()

    # WHEN approve runs with the trace, then without
    run(sender, clock, out, reader=None, wait=None, signing_key=load_private_key(private_pem), trace=trace_id)
    run(sender, clock, out, reader=None, wait=None)

    # THEN the first command is a new span of that trace, inside the signed body; the second has none
    traced, untraced = (decode_command(message.body) for message in sender.sent)
    assert traced.command.trace is not None
    assert traced.command.trace.trace_id == trace_id
    assert len(traced.command.trace.span_id) == 16
    assert traced.trace_problem is None
    assert traced.command.signature is not None
    verify(traced.canonical, traced.command.signature, load_public_key(public_pem))
    assert untraced.command.trace is None
    assert b"traceparent" not in sender.sent[1].body


@pytest.mark.parametrize(
    "wrong", ["4BF92F3577B34DA6A3CE929D0E0E4736", "0" * 32, "abc", "00-" + "1" * 32 + "-" + "2" * 16 + "-01"]
)
def test_a_trace_flag_that_is_no_trace_id_is_a_usage_error(wrong: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    approve_cli.configure(parser)
    assert parser.parse_args(["--event-id", EVENT_ID, "--target", VM]).trace is None
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--event-id", EVENT_ID, "--target", VM, "--trace", wrong])
    assert exited.value.code == 2
    assert "is not a trace id" in capsys.readouterr().err


@pytest.mark.parametrize(("accepted", "code"), [(True, 0), (False, 1)])
def test_exit_code_follows_the_agents_answer(
    sender: FakeSender, clock: FakeClock, out: io.StringIO, accepted: bool, code: int
) -> None:
    # GIVEN the agent answers the command
    reason = "approved: StartRequests POSTed" if accepted else f"event {EVENT_ID} is already Started"
    reader = FakeAgentOnTheBus(clock, sender, lambda cid: [result_body(cid, accepted, reason)])

    # WHEN approve waits for it
    exit_code = run(sender, clock, out, reader)

    # THEN the exit code and the printed reason follow the result
    assert exit_code == code
    outcome = "accepted" if accepted else "rejected"
    assert out.getvalue().splitlines()[-1] == f"{outcome} by {VM}: {reason}"


def test_other_envelopes_and_other_commands_results_are_skipped(
    sender: FakeSender, clock: FakeClock, out: io.StringIO
) -> None:
    # GIVEN the channel carries junk, a maintenance event, another command's result, a result for this
    # command from a VM that is not the target, then the real answer
    def answer(command_id: str) -> list[bytes]:
        return [
            b"not json",
            json.dumps({"specversion": "1.0"}).encode(),
            encode(envelope_for_event(azure_event(), START)),
            result_body("someone-elses-command", True, "approved elsewhere"),
            result_body(command_id, True, "forged by a neighbour", target="WestNO_1"),
            result_body(command_id, False, "this VM is not in Resources"),
        ]

    reader = FakeAgentOnTheBus(clock, sender, answer)

    # WHEN approve waits
    code = run(sender, clock, out, reader)

    # THEN only this command's answer from the target counts
    assert code == 1
    assert out.getvalue().splitlines()[-1] == f"rejected by {VM}: this VM is not in Resources"


def test_a_forged_answer_is_ignored_and_said_so_and_the_targets_own_counts(
    sender: FakeSender, clock: FakeClock, out: io.StringIO
) -> None:
    # GIVEN a neighbour publishing "accepted" in the target's name (with its own proof, and with none)
    # before the target's genuine "rejected"
    def answer(command_id: str) -> list[bytes]:
        return [
            result_body(command_id, True, "forged", proven_by="WestNO_1"),
            result_body(command_id, True, "forged", proven_by=None),
            result_body(command_id, False, "this VM is not in Resources"),
        ]

    # WHEN approve waits
    code = run(sender, clock, out, FakeAgentOnTheBus(clock, sender, answer))

    # THEN the forgeries are printed as ignored, and the target's answer decides
    assert code == 1
    lines = out.getvalue().splitlines()
    assert lines[-3] == f"ignored a 'accepted' result for {VM} proven by WestNO_1"
    assert lines[-2] == f"ignored a 'accepted' result without a valid proof of {VM}: no proof of identity"
    assert lines[-1] == f"rejected by {VM}: this VM is not in Resources"


def test_without_a_verifier_any_answer_counts_and_the_output_says_it_was_not_verified(
    sender: FakeSender, clock: FakeClock, out: io.StringIO
) -> None:
    reader = FakeAgentOnTheBus(clock, sender, lambda cid: [result_body(cid, True, "approved", proven_by=None)])
    code = run_approve(
        event_id=EVENT_ID, target=VM, cloud=Cloud.AZURE, sender=sender, reader=reader, wait=30,
        signing_key=None, verifier=None, clock=clock, out=out,
    )  # fmt: skip
    assert code == 0
    assert (
        out.getvalue().splitlines()[-1] == f"accepted by {VM} (not verified: --insecure-unverified-results): approved"
    )


def test_no_answer_within_the_wait_is_exit_2(sender: FakeSender, clock: FakeClock, out: io.StringIO) -> None:
    # GIVEN an agent that never answers
    reader = FakeAgentOnTheBus(clock, sender, lambda cid: [])

    # WHEN approve waits 12 s
    code = run(sender, clock, out, reader, wait=12)

    # THEN it gives up after the wait (in slices no longer than what remains) and says so
    assert code == 2
    assert sum(reader.reads) == pytest.approx(12)
    assert all(wait <= 5 for wait in reader.reads)
    assert "no answer for command" in out.getvalue()
    assert "within 12 s" in out.getvalue()


def test_waiting_without_a_reader_is_exit_2_and_names_the_subscription(
    sender: FakeSender, clock: FakeClock, out: io.StringIO
) -> None:
    code = run(sender, clock, out, reader=None, wait=30)
    assert code == 2
    assert len(sender.sent) == 1
    assert "subscription" in out.getvalue()
    assert "maintenance-events" in out.getvalue()


def test_a_send_failure_prints_the_error_and_is_exit_2(clock: FakeClock, out: io.StringIO) -> None:
    code = run(FakeSender(fail=True), clock, out, reader=None, wait=None)
    assert code == 2
    assert "could not send the approve command" in out.getvalue()
    assert "503" in out.getvalue()


def test_gce_is_refused_before_anything_is_sent(sender: FakeSender, clock: FakeClock, out: io.StringIO) -> None:
    code = run(sender, clock, out, reader=None, wait=None, cloud=Cloud.GCE)
    assert code == 1
    assert sender.sent == []
    assert "perform-maintenance" in out.getvalue()


def test_the_cli_refuses_to_wait_for_an_answer_it_could_not_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN mbridge approve with no way to check who answers
    parser = argparse.ArgumentParser()
    approve_cli.configure(parser)
    args = parser.parse_args(["--event-id", EVENT_ID, "--target", VM, "--transport", "local",
                              "--bus-path", str(tmp_path / "bus.db")])  # fmt: skip
    args.trust_file = args.trust_subscriptions = args.trust_resource_groups = None

    # WHEN it runs THEN it sends nothing and says what to give it
    assert approve_cli.run(args) == 2
    error = capsys.readouterr().err
    assert "--trust-subscriptions" in error
    assert "--insecure-unverified-results" in error
