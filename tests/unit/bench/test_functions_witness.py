"""The benchmarks' readers of the simulator's logs and the agent's command ledger, and their statistics."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from bench.functions_witness import (
    accepted_approvals,
    after_notice_ms,
    approval_posts,
    describe_sample,
    first_done,
    moment,
    notices,
    published,
    read_ledger,
    summarise,
    where_the_time_goes,
)

EVENT = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
OTHER = "0B1C2D3E-4F50-4617-8A9B-C0D1E2F30415"


def test_notice_is_when_the_simulator_logged_the_event_added_keyed_by_lower_case_id() -> None:
    # GIVEN the simulator's log: the event added, then started
    log = [
        {"time": "2024-05-01T12:00:00.000Z", "message": "azure simulator at speed 10: vm-0 http://127.0.0.1:1"},
        {"time": "2024-05-01T12:00:01.250Z", "message": f"event {EVENT} added: Reboot Scheduled on vm-0, ..."},
        {"time": "2024-05-01T12:00:05.000Z", "message": f"event {EVENT} Started (approved by vm-0)"},
    ]

    # THEN the notice is the "added" line, in Unix seconds
    assert notices(log) == {EVENT.lower(): pytest.approx(1714564801.25)}


def test_the_system_clock_time_of_a_log_entry_wins_over_its_text_time() -> None:
    # GIVEN an entry carrying both (the text is milliseconds on another scale)
    entry = {"time": "2024-05-01T12:00:01.250Z", "unix_time": 1714564801.251234}

    # THEN the microsecond one is taken; without it, the text
    assert moment(entry) == pytest.approx(1714564801.251234)
    assert moment({"time": "2024-05-01T12:00:01.250Z"}) == pytest.approx(1714564801.25)


def test_approval_is_the_first_accepted_post_naming_the_event_in_any_case() -> None:
    # GIVEN a refused POST, the accepted one (lower-case id), and a repeat
    approvals = [
        {"time": "2024-05-01T12:00:01.000Z", "event_ids": [OTHER], "outcome": "unknown-event", "source": "http"},
        {"time": "2024-05-01T12:00:02.000Z", "event_ids": [EVENT.lower()], "outcome": "accepted", "source": "http"},
        {"time": "2024-05-01T12:00:03.000Z", "event_ids": [EVENT], "outcome": "already-approved", "source": "http"},
    ]

    # THEN the accepted one dates the approval, and both POSTs naming the event count as POSTs
    assert accepted_approvals(approvals) == {EVENT.lower(): pytest.approx(1714564802.0)}
    assert len(approval_posts(approvals, EVENT)) == 2


def test_a_scenario_step_is_not_a_post_from_a_vm() -> None:
    approvals = [
        {"time": "2024-05-01T12:00:02.000Z", "event_ids": [EVENT], "outcome": "accepted", "source": "scenario"}
    ]

    assert approval_posts(approvals, EVENT) == []


def _ledger(path: Path, rows: list[tuple[str, str, str, str, int | None, float, float]]) -> Path:
    with closing(sqlite3.connect(path)) as db:
        db.execute(
            "CREATE TABLE commands (command_id TEXT, type TEXT, event_id TEXT, state TEXT, accepted INTEGER, "
            "received_at REAL, updated_at REAL)"
        )
        db.executemany("INSERT INTO commands VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        db.commit()
    return path


def test_the_drain_is_the_first_accepted_finished_drain_after_the_notice(tmp_path: Path) -> None:
    # GIVEN a ledger: an old drain, a rejected one, the drain of this event, a restore
    ledger = _ledger(
        tmp_path / "commands.db",
        [
            ("a", "drain", "drain-vm-0", "done", 1, 90.0, 90.1),
            ("b", "drain", "drain-vm-0", "done", 0, 100.5, 100.6),
            ("c", "drain", "drain-vm-0", "done", 1, 101.0, 101.002),
            ("d", "restore", "restore-vm-0", "done", 1, 105.0, 105.1),
        ],
    )

    # WHEN it is read after a notice at 100 s
    rows = read_ledger(ledger)
    drain = first_done(rows, "drain", after=100.0)

    # THEN the accepted drain finished after the notice is the one
    assert drain is not None
    assert drain.command_id == "c"
    assert drain.updated_at == pytest.approx(101.002)
    assert first_done(rows, "approve", after=0.0) is None


def test_a_ledger_that_does_not_exist_yet_reads_as_empty(tmp_path: Path) -> None:
    assert read_ledger(tmp_path / "missing.db") == []


def test_published_is_read_from_the_outbox(tmp_path: Path) -> None:
    # GIVEN an outbox with one published envelope and one still pending
    outbox = tmp_path / "agent.db"
    with closing(sqlite3.connect(outbox)) as db:
        db.execute("CREATE TABLE outbox (envelope_id TEXT, published_at REAL)")
        db.executemany("INSERT INTO outbox VALUES (?, ?)", [("sent", 1.0), ("pending", None)])
        db.commit()

    # THEN only the published one counts
    assert published(outbox, "sent")
    assert not published(outbox, "pending")
    assert not published(tmp_path / "none.db", "sent")


def test_stage_statistics_skip_what_a_sample_did_not_see() -> None:
    # GIVEN two events, the second without a published time
    samples: list[dict[str, float | None]] = [
        {"detected": 100.0, "published": 110.0, "approved": 600.0},
        {"detected": 900.0, "published": None, "approved": 1400.0},
    ]

    # WHEN they are summarised
    summaries = {summary.stage: summary for summary in summarise(samples, ["detected", "published", "approved"])}

    # THEN each stage counts the samples that saw it (nearest-rank percentiles)
    assert (summaries["detected"].p50, summaries["detected"].p99, summaries["detected"].count) == (100.0, 900.0, 2)
    assert summaries["published"].count == 1
    assert after_notice_ms(10.0, 10.25) == pytest.approx(250.0)
    assert after_notice_ms(10.0, None) is None


def test_where_the_time_goes_takes_the_median_of_each_step() -> None:
    samples: list[dict[str, float | None]] = [
        {"detected": 100.0, "published": 110.0, "approved": 600.0},
        {"detected": 900.0, "published": 930.0, "approved": 1400.0},
        {"detected": 500.0, "published": 520.0, "approved": 1000.0},
    ]

    text = where_the_time_goes(samples, ["detected", "published", "approved"])

    # THEN steps are per sample, then the median: published→approved is 490, 470, 480
    assert text == "notice→detected 500 ms, detected→published 20 ms, published→approved 480 ms"
    assert describe_sample(samples[0], ["detected", "missing", "approved"]) == "detected +100, approved +600"
