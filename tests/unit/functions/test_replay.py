"""`mbridge replay` runs what the functions took through their own path again and prints what they did
(docs/contracts.md#replay-output): the actions of the agent's recorded output, and the refusals of
reports whose proof does not hold, judged as of when the functions received them."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from functions.core.policy import PolicyError, load_policy
from functions.local_app.recording import format_received
from functions.local_app.replay import INCOMPLETE, DryBalancer, DrySender, Trust, replay, reporter_names
from tests.factories import azure_event
from tests.fixtures import FIXTURES
from tests.identity import ProofsOfTest, proven
from wire.commands import CommandType
from wire.envelope import Envelope, envelope_for_event
from wire.errors import RetryableError
from wire.identity import Identity, ProofExpiredError
from wire.model import EventKind, EventStatus, MaintenanceEvent
from wire.timefmt import parse_rfc3339

ROOT = Path(__file__).resolve().parents[3]
RECORDINGS = FIXTURES / "agent-output"
TEST_PROOFS = Trust(ProofsOfTest(), "the proofs of the tests")


def run(lines: list[str], policy: str | None = None, trust: Trust | None = None) -> tuple[list[dict[str, Any]], str]:
    out, err = io.StringIO(), io.StringIO()
    assert replay(lines, load_policy(policy), trust or reporter_names(), out, err) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def actions(name: str) -> list[tuple[str, str, str]]:
    lines = (RECORDINGS / f"{name}.jsonl").read_text().splitlines()
    return [(a["status"], a["action"], a["vm"]) for a in run(lines)[0]]


@pytest.mark.parametrize(
    ("recording", "expected"),
    [
        # a 5 s Freeze: approved at once, never drained, nothing to restore
        (
            "live-migration",
            [("scheduled", "approve", "WestNO_0"), ("started", "none", "WestNO_0"), ("completed", "none", "WestNO_0")],
        ),
        # user-initiated: drained, approved at once, restored after
        (
            "user-reboot",
            [
                ("scheduled", "drain", "vm-0"),
                ("scheduled", "approve", "vm-0"),
                ("started", "none", "vm-0"),
                ("completed", "restore", "vm-0"),
            ],
        ),
        # platform: the reporter drained and restored (web-0 recorded it; web-1, also in Resources, is
        # moved by its own agent's report, not by web-0's); no approval, since one would start the
        # Reboot of web-1 too, which nothing drained
        (
            "platform-reboot",
            [
                ("scheduled", "drain", "web-0"),
                ("scheduled", "none", "web-0"),
                ("started", "none", "web-0"),
                ("completed", "restore", "web-0"),
            ],
        ),
        # canceled while Scheduled: restored, and no further approval
        (
            "canceled-redeploy",
            [("scheduled", "drain", "vm-0"), ("scheduled", "approve", "vm-0"), ("canceled", "restore", "vm-0")],
        ),
    ],
)
def test_recorded_agent_output_replays_to_the_promised_actions(
    recording: str, expected: list[tuple[str, str, str]]
) -> None:
    assert actions(recording) == expected


def test_platform_approval_waits_for_the_drain_period_on_the_virtual_clock() -> None:
    # web-0's recording, with web-1's own report of the same step beside it: both are then out
    lines = (RECORDINGS / "platform-reboot.jsonl").read_text().splitlines()
    web_1 = json.loads(lines[0])
    web_1["source"], web_1["data"]["reporter"] = "/azure/web-1", "web-1"
    (approval,) = [a for a in run([lines[0], json.dumps(web_1), *lines[1:]])[0] if a["action"] == "approve"]
    assert approval["vm"] == "web-1"
    assert approval["at"] > approval["time"]
    assert approval["reason"].startswith("platform reboot: drain, approve after the 30 s drain period")


def test_duplicates_take_no_new_action() -> None:
    # GIVEN the recording delivered three times over
    lines = (RECORDINGS / "user-reboot.jsonl").read_text().splitlines()
    once, _ = run(lines)
    thrice, _ = run(lines * 3)
    # THEN the actions are those of one delivery
    assert thrice == once


def test_steps_recorded_after_their_events_end_are_replayed_as_late_with_no_drain() -> None:
    # GIVEN a recording whose completion came before the scheduled and started steps (an unordered
    # bus, or a failed delivery retried after the end)
    scheduled, started, completed = (RECORDINGS / "platform-reboot.jsonl").read_text().splitlines()

    # WHEN it is replayed
    result, _ = run([completed, scheduled, started])

    # THEN nothing is drained or approved, and the late steps say why
    assert [(a["status"], a["action"]) for a in result] == [
        ("completed", "none"),
        ("scheduled", "none"),
        ("started", "none"),
    ]
    assert [a["reason"] for a in result[1:]] == [
        "late: event already completed at 2026-11-22T03:51:23.318Z, nothing to do"
    ] * 2


def test_a_policy_file_changes_the_decisions() -> None:
    lines = (RECORDINGS / "platform-reboot.jsonl").read_text().splitlines()
    result, _ = run(lines, json.dumps({"approve_platform_events": False}))
    assert "approve" not in [a["action"] for a in result]


def test_lines_that_are_not_envelopes_are_reported_and_skipped() -> None:
    lines = ["not json", *(RECORDINGS / "user-reboot.jsonl").read_text().splitlines()]
    result, err = run(lines)
    assert "line 1: skipped" in err
    assert len(result) == 4


def test_cli_exit_codes() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "mbridge.cli", "replay", "--events", str(RECORDINGS / "user-reboot.jsonl"),
         "--trust-reporter-name"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    missing = subprocess.run(
        [sys.executable, "-m", "mbridge.cli", "replay", "--events", "/nonexistent/events.jsonl",
         "--trust-reporter-name"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert ok.returncode == 0
    assert len(ok.stdout.splitlines()) == 4
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr


def replay_cli(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mbridge.cli", "replay", *arguments],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip


def test_input_without_a_single_envelope_is_an_error(tmp_path: Path) -> None:
    # GIVEN a file with lines, none of them an envelope (the wrong file, or the agent's log)
    events = tmp_path / "agent.log"
    events.write_text('{"level": "info", "message": "agent running"}\nnot json\n', encoding="utf-8")
    # WHEN it is replayed THEN nothing is pretended: exit 2, saying so and naming the file
    finished = replay_cli(tmp_path, "--events", str(events), "--trust-reporter-name")
    assert finished.returncode == 2
    assert finished.stdout == ""
    assert f"mbridge replay: no line of {events} is an envelope or a recorded input" in finished.stderr
    # AND an empty file too
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    assert replay_cli(tmp_path, "--events", str(empty), "--trust-reporter-name").returncode == 2


def test_a_missing_policy_file_is_named_as_the_policy(tmp_path: Path) -> None:
    finished = replay_cli(
        tmp_path, "--events", str(RECORDINGS / "user-reboot.jsonl"), "--policy", str(tmp_path / "policy.json"),
        "--trust-reporter-name",
    )  # fmt: skip
    assert finished.returncode == 2
    assert f"mbridge replay: cannot read the policy file {tmp_path / 'policy.json'}" in finished.stderr
    assert "the input" not in finished.stderr


def test_a_missing_events_file_is_named_as_the_events(tmp_path: Path) -> None:
    finished = replay_cli(tmp_path, "--events", str(tmp_path / "events.jsonl"), "--trust-reporter-name")
    assert finished.returncode == 2
    assert f"mbridge replay: cannot read the events file {tmp_path / 'events.jsonl'}" in finished.stderr


def test_a_truncated_json_policy_gets_a_json_error(tmp_path: Path) -> None:
    # GIVEN a JSON policy cut short (as an editor or a copy may leave it)
    policy = tmp_path / "policy.json"
    policy.write_text('{"drain_period_seconds": 10,\n "approve_platform_events": ', encoding="utf-8")
    # WHEN it is used THEN the error is JSON's, with its position, not a YAML parser's
    finished = replay_cli(
        tmp_path, "--events", str(RECORDINGS / "user-reboot.jsonl"), "--policy", str(policy), "--trust-reporter-name"
    )
    assert finished.returncode == 2
    assert "is not valid JSON" in finished.stderr
    assert "line 2" in finished.stderr
    assert "yaml" not in finished.stderr.lower()


def test_a_json_looking_policy_of_any_name_gets_a_json_error() -> None:
    # GIVEN JSON text cut short, from a setting rather than a file (no name to go by)
    with pytest.raises(PolicyError, match="is not valid JSON"):
        load_policy('{"drain_period_seconds": 10,')
    # AND YAML flow style, which is not JSON, still loads
    assert load_policy("{drain_period_seconds: 12}").drain_period_seconds == 12


# A platform Reboot of web-0 alone, and the moments of its steps.
SCHEDULED_AT = parse_rfc3339("2026-03-01T12:00:00Z")


def reboot(status: EventStatus, reporter: str = "web-0", resources: tuple[str, ...] = ("web-0",)) -> MaintenanceEvent:
    return azure_event(
        event_id="5DD55B64-0A8B-4C53-9E2B-6E1F3D2A9B10",
        kind=EventKind.REBOOT,
        status=status,
        reporter=reporter,
        resources=resources,
        duration_seconds=-1,
        not_before=SCHEDULED_AT + timedelta(minutes=15),
    )


def received(body: bytes, at: datetime) -> str:
    """A line of what the functions recorded (functions/local_app/recording.py)."""
    return json.dumps({"received_at": format_received(at), "envelope": json.loads(body)})


def forged_story(trust: Trust) -> list[tuple[str, str, str]]:
    """web-0's genuine Reboot, with a completion of it forged by web-2 while web-0 is drained, and a
    report of it that web-2 makes about web-0 and web-1: (kind, action, status) per line printed."""
    at = SCHEDULED_AT
    lines = [
        received(proven(envelope_for_event(reboot(EventStatus.SCHEDULED), at), "web-0"), at),
        received(proven(envelope_for_event(reboot(EventStatus.COMPLETED), at), "web-2"), at + timedelta(seconds=5)),
        received(
            proven(
                envelope_for_event(reboot(EventStatus.STARTED, "web-2", ("web-0", "web-1")), at + timedelta(seconds=6)),
                "web-2",
            ),
            at + timedelta(seconds=6),
        ),
        received(
            proven(envelope_for_event(reboot(EventStatus.COMPLETED), at + timedelta(minutes=20)), "web-0"),
            at + timedelta(minutes=20),
        ),
    ]
    result, _ = run(lines, trust=trust)
    return [(a["kind"], a["action"], a["status"]) for a in result]


def test_forged_reports_are_refused_as_the_functions_refuse_them_and_only_the_genuine_end_restores() -> None:
    # WHEN the story is replayed with the trust the functions have
    # THEN the forged completion and web-2's report about others are refused, and web-0 is restored once,
    # by its own completion
    assert forged_story(TEST_PROOFS) == [
        ("action", "drain", "scheduled"),
        ("action", "approve", "scheduled"),  # to be executed after the drain period
        ("unverified", "none", "completed"),
        ("not-self", "none", "started"),
        ("action", "restore", "completed"),
    ]


def test_taking_reporters_at_their_word_tells_the_story_the_functions_never_told() -> None:
    # WHEN the same story is replayed taking each reporter at its word (as replay once did, unasked)
    # THEN the forged completion puts web-0 back five seconds after its drain: what the flag warns of
    story = forged_story(reporter_names())
    assert story[:2] == [("action", "drain", "scheduled"), ("action", "approve", "scheduled")]
    assert story[2] == ("action", "restore", "completed")
    assert ("unverified", "none", "completed") not in story


class ProofsWithALife:
    """The tests' proofs, made when their envelope was, and expired an hour later as the clouds' are;
    every moment it was asked to judge at is kept."""

    life = timedelta(hours=1)

    def __init__(self) -> None:
        self.asked: list[tuple[datetime, datetime]] = []  # (accepted_at, now)

    def verify(self, envelope: Envelope, accepted_at: datetime, now: datetime) -> Identity:
        self.asked.append((accepted_at, now))
        if accepted_at > envelope.time + self.life:
            raise ProofExpiredError(f"the proof expired at {envelope.time + self.life:%H:%M}")
        return ProofsOfTest().verify(envelope, accepted_at, now)


def test_each_proof_is_judged_as_of_when_the_functions_received_its_message() -> None:
    # GIVEN a report proven when it was made, received by the functions ten minutes later; and the same
    # report as a resubmission received two hours later
    body = proven(envelope_for_event(reboot(EventStatus.SCHEDULED), SCHEDULED_AT), "web-0")
    proofs = ProofsWithALife()

    # WHEN each is replayed (long after both: the clock replay runs at is not the present)
    on_time, _ = run([received(body, SCHEDULED_AT + timedelta(minutes=10))], trust=Trust(proofs, "proofs"))
    late, _ = run([received(body, SCHEDULED_AT + timedelta(hours=2))], trust=Trust(proofs, "proofs"))

    # THEN the proof was judged, and the actions stamped, as of each one's recorded time
    assert proofs.asked == [
        (SCHEDULED_AT + timedelta(minutes=10), SCHEDULED_AT + timedelta(minutes=10)),
        (SCHEDULED_AT + timedelta(hours=2), SCHEDULED_AT + timedelta(hours=2)),
    ]
    assert on_time[0]["action"] == "drain"
    assert on_time[0]["time"] == "2026-03-01T12:10:00Z"
    # AND the resubmission is refused as the functions refuse it: expired, naming the recovery
    (refused,) = late
    assert (refused["kind"], refused["action"], refused["time"]) == ("unverified", "none", "2026-03-01T14:00:00Z")
    assert "expired" in refused["reason"]
    assert "mbridge recover" in refused["reason"]


def test_a_bare_envelope_is_judged_as_of_its_own_time_and_replay_says_so() -> None:
    # GIVEN the agent's own output: envelopes, no time of receipt
    body = proven(envelope_for_event(reboot(EventStatus.SCHEDULED), SCHEDULED_AT), "web-0")
    proofs = ProofsWithALife()
    result, err = run([body.decode()], trust=Trust(proofs, "proofs"))
    # THEN its own time stands in, and replay says whose time that is
    assert proofs.asked == [(SCHEDULED_AT, SCHEDULED_AT)]
    assert result[0]["action"] == "drain"
    assert "line 1: an envelope without received_at: its proof is judged as of its own time" in err


def test_replay_drains_nothing_and_sends_nothing_its_dry_ports_keep_what_was_asked() -> None:
    # GIVEN dry ports of its own
    balancer, sender = DryBalancer(), DrySender()
    lines = (RECORDINGS / "user-reboot.jsonl").read_text().splitlines()
    out, err = io.StringIO(), io.StringIO()
    # WHEN the user Reboot of vm-0 is replayed
    assert replay(lines, load_policy(None), reporter_names(), out, err, balancer=balancer, sender=sender) == 0
    # THEN what the functions would have done was asked of them, and of nothing else
    assert balancer.asked == [("remove", "vm-0"), ("restore", "vm-0")]
    assert [(command.type, command.target) for command in sender.sent] == [(CommandType.APPROVE, "vm-0")]
    # AND replay said how it took the reports
    assert err.getvalue().startswith("mbridge replay: trust: each report taken at its reporter's word")


def test_a_recorded_message_that_was_no_envelope_is_replayed_as_malformed() -> None:
    # GIVEN a message the functions took that was not an envelope (recorded as its text)
    line = json.dumps({"received_at": "2026-03-01T12:00:00Z", "envelope": "not an envelope"})
    result, _ = run([line], trust=TEST_PROOFS)
    # THEN it is audited as the functions audited it
    assert [(a["kind"], a["time"]) for a in result] == [("malformed", "2026-03-01T12:00:00Z")]


class Unreachable:
    def verify(self, envelope: Envelope, accepted_at: datetime, now: datetime) -> Identity:
        raise RetryableError("Google's certificates cannot be fetched now")


def test_a_proof_that_cannot_be_checked_now_leaves_the_replay_incomplete_and_says_which_line() -> None:
    lines = (RECORDINGS / "user-reboot.jsonl").read_text().splitlines()
    out, err = io.StringIO(), io.StringIO()
    assert replay(lines, load_policy(None), Trust(Unreachable(), "unreachable"), out, err) == INCOMPLETE
    assert out.getvalue() == ""
    assert "line 1: not processed, it could not be checked now: Google's certificates cannot be fetched now" in (
        err.getvalue()
    )


def test_without_trust_settings_replay_refuses_to_guess(tmp_path: Path) -> None:
    # GIVEN no trust file, no function app's settings and no --trust-reporter-name
    finished = subprocess.run(
        [sys.executable, "-m", "mbridge.cli", "replay", "--events", str(RECORDINGS / "user-reboot.jsonl")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={name: value for name, value in os.environ.items() if name != "MBRIDGE_TRUST_FILE"},
    )  # fmt: skip
    # THEN nothing is replayed, and the three ways are named
    assert finished.returncode == 2
    assert finished.stdout == ""
    for way in ("--trust-file", "--trust-settings azure|gcp", "--trust-reporter-name"):
        assert way in finished.stderr


def test_a_policy_whose_trust_is_reporter_name_is_replayed_as_the_functions_run_it(tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text('{"trust": "reporter-name"}', encoding="utf-8")
    finished = replay_cli(tmp_path, "--events", str(RECORDINGS / "user-reboot.jsonl"), "--policy", str(policy))
    assert finished.returncode == 0, finished.stderr
    assert len(finished.stdout.splitlines()) == 4
    assert "trust: the policy's trust is reporter-name" in finished.stderr


def test_an_unusable_trust_file_is_named(tmp_path: Path) -> None:
    trust = tmp_path / "trust.json"
    trust.write_text('{"format": "something else"}', encoding="utf-8")
    finished = replay_cli(tmp_path, "--events", str(RECORDINGS / "user-reboot.jsonl"), "--trust-file", str(trust))
    assert finished.returncode == 2
    assert "mbridge replay: not a trust file" in finished.stderr
