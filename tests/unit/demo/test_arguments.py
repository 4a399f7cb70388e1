"""`mbridge demo`'s flags are checked when they are read: a value the demo cannot run with is one
line naming the flag and exit 2 (a usage error), never a traceback or a run that fails as if the
product were wrong."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from mbridge.cli import build_parser
from mbridge.demo.cli import MAX_DRAIN_PERIOD, MAX_SPEED, MIN_SPEED


def parse(*argv: str) -> argparse.Namespace:
    return build_parser("demo").parse_args(["demo", *argv])


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What the parser says about `argv`, which it must refuse with exit 2."""
    with pytest.raises(SystemExit) as exited:
        parse(*argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "fast", str(MIN_SPEED / 2), str(MAX_SPEED + 1)])
def test_a_speed_the_flows_are_not_timed_for_is_a_usage_error(capsys: pytest.CaptureFixture[str], value: str) -> None:
    # Slower, a Spot eviction's notice or a dead agent's outlasts its phase; faster, a dead agent's
    # event is over before the functions can find it silent. Either would fail an expectation.
    err = refused(capsys, "--speed", value)

    assert "argument --speed" in err
    assert f"between {MIN_SPEED:g} and {MAX_SPEED:g}" in err


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon", str(MAX_DRAIN_PERIOD + 0.5)])
def test_a_drain_period_the_demo_cannot_play_is_a_usage_error(capsys: pytest.CaptureFixture[str], value: str) -> None:
    err = refused(capsys, "--drain-period", value)

    assert "argument --drain-period" in err
    assert f"between 0 and {MAX_DRAIN_PERIOD:g}" in err


def test_a_workdir_that_cannot_be_created_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(capsys, "--workdir", "/proc/x")

    assert "argument --workdir" in err
    assert "/proc/x" in err


def test_a_workdir_that_is_a_file_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a_file = tmp_path / "state"
    a_file.write_text("not a directory", encoding="utf-8")

    err = refused(capsys, "--workdir", str(a_file))

    assert "argument --workdir" in err
    assert "not a directory" in err


def test_a_report_in_a_directory_that_is_not_there_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Found at the end of a run, it would cost the whole demo and end in a traceback.
    err = refused(capsys, "--report", str(tmp_path / "missing" / "report.html"))

    assert "argument --report" in err
    assert str(tmp_path / "missing") in err


def test_values_the_demo_can_run_with_are_taken(tmp_path: Path) -> None:
    workdir = tmp_path / "new" / "work"

    args = parse(
        "--speed", "4.5", "--drain-period", "0", "--workdir", str(workdir), "--report", str(tmp_path / "r.html")
    )  # fmt: skip

    assert args.speed == 4.5
    assert args.drain_period == 0.0
    assert args.workdir == workdir
    assert workdir.is_dir()
    assert args.report == str(tmp_path / "r.html")
    assert parse("--drain-period", str(MAX_DRAIN_PERIOD)).drain_period == MAX_DRAIN_PERIOD
    assert parse("--speed", str(MIN_SPEED)).speed == MIN_SPEED
    assert parse("--speed", str(MAX_SPEED)).speed == MAX_SPEED
