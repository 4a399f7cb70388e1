"""`mbridge replay` over the agent's recorded output prints the actions of docs/contracts.md#replay-output."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from functions.core.policy import PolicyError, load_policy
from functions.local_app.replay import replay
from tests.fixtures import FIXTURES

ROOT = Path(__file__).resolve().parents[3]
RECORDINGS = FIXTURES / "agent-output"


def run(lines: list[str], policy: str | None = None) -> tuple[list[dict[str, Any]], str]:
    out, err = io.StringIO(), io.StringIO()
    assert replay(lines, policy, out, err) == 0
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
        [sys.executable, "-m", "mbridge.cli", "replay", "--events", str(RECORDINGS / "user-reboot.jsonl")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    missing = subprocess.run(
        [sys.executable, "-m", "mbridge.cli", "replay", "--events", "/nonexistent/events.jsonl"],
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
    finished = replay_cli(tmp_path, "--events", str(events))
    assert finished.returncode == 2
    assert finished.stdout == ""
    assert f"mbridge replay: no line of {events} is an envelope" in finished.stderr
    # AND an empty file too
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    assert replay_cli(tmp_path, "--events", str(empty)).returncode == 2


def test_a_missing_policy_file_is_named_as_the_policy(tmp_path: Path) -> None:
    finished = replay_cli(
        tmp_path, "--events", str(RECORDINGS / "user-reboot.jsonl"), "--policy", str(tmp_path / "policy.json")
    )
    assert finished.returncode == 2
    assert f"mbridge replay: cannot read the policy file {tmp_path / 'policy.json'}" in finished.stderr
    assert "the input" not in finished.stderr


def test_a_missing_events_file_is_named_as_the_events(tmp_path: Path) -> None:
    finished = replay_cli(tmp_path, "--events", str(tmp_path / "events.jsonl"))
    assert finished.returncode == 2
    assert f"mbridge replay: cannot read the events file {tmp_path / 'events.jsonl'}" in finished.stderr


def test_a_truncated_json_policy_gets_a_json_error(tmp_path: Path) -> None:
    # GIVEN a JSON policy cut short (as an editor or a copy may leave it)
    policy = tmp_path / "policy.json"
    policy.write_text('{"drain_period_seconds": 10,\n "approve_platform_events": ', encoding="utf-8")
    # WHEN it is used THEN the error is JSON's, with its position, not a YAML parser's
    finished = replay_cli(tmp_path, "--events", str(RECORDINGS / "user-reboot.jsonl"), "--policy", str(policy))
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
