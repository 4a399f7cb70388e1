"""`mbridge fleet` on the local host's SQLite audit log, written by the core itself (`process`,
`process_central` and the silent-agent sweep of test_central.py's world, on a database file).

GIVEN maintenance the core processed into the log
WHEN  `mbridge fleet` is run with the log's flags
THEN  it prints one aligned row per (VM, event) not ended (or every one with --all, JSON with --json),
      refuses a window larger than its limit, and shows hostile values safely.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from functions.core.central import process_central
from functions.core.ports import AuditKind, AuditRecord
from mbridge.cli import main
from mbridge.text_table import cell, width
from tests.unit.functions.test_central import EVENT_ID, SET, SILENT_AFTER, START, World, central, reboot
from tests.unit.functions.test_trust import opened
from wire.model import EventStatus

SINCE = ["--since", "2026-03-01T00:00:00Z"]
OTHER = "9A1B2C3D-0000-4000-8000-000000000001"
THIRD = "E-THIRD"


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[tuple[World, list[str]]]:
    """A world whose store (and audit log) is a database file, and the flags that name it."""
    with opened(World, SET, tmp_path / "functions.db") as world:
        yield world, ["--db", str(tmp_path / "functions.db")]


def fleet(flags: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["fleet", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def maintenance(world: World) -> None:
    """web-0: its agent's Reboot, drained and approved; web-1: another Reboot, the control plane's
    only, its agent silent (policy: drain); web-2: a third its agent reported scheduled, then completed."""
    world.policy = replace(world.policy, silent_agents="drain")
    world.agent(EventStatus.SCHEDULED, vm="web-0")
    world.outcomes += process_central(
        replace(central(EventStatus.SCHEDULED, vms=("web-1",)), event_id=OTHER), world.deps(), world.clock.now()
    )
    for status in (EventStatus.SCHEDULED, EventStatus.COMPLETED):
        world.report(replace(reboot(status, of="web-2"), event_id=THIRD), by="web-2", at=world.clock.now())
        world.clock.advance(SILENT_AFTER)
    world.sweep()


def test_the_events_not_ended_come_as_an_aligned_table(
    logged: tuple[World, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    world, flags = logged
    maintenance(world)

    code, out, _ = fleet([*flags, *SINCE], capsys)

    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "VM", "EVENT", "KIND", "NOT", "BEFORE", "STATUS", "SOURCE", "DRAINED", "APPROVED", "ENDED", "SILENT"
    ]  # fmt: skip
    assert [line.split() for line in lines[1:]] == [
        ["web-0", "5DD55B64…", "reboot", "2026-03-01T12:15:00Z", "scheduled", "agent", "yes", "sent"],
        ["web-1", "9A1B2C3D…", "reboot", "2026-03-01T12:15:00Z", "scheduled", "centre", "yes", "yes"],
    ]
    # aligned: every column starts where its header does
    assert lines[1].index("5DD55B64") == lines[0].index("EVENT") == lines[2].index("9A1B2C3D")
    assert lines[2].index("yes", lines[0].index("SILENT")) == lines[0].index("SILENT")


def test_all_json_vm_and_wide(logged: tuple[World, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    world, flags = logged
    maintenance(world)

    code, out, _ = fleet([*flags, *SINCE, "--all", "--json"], capsys)
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert fleet([*flags, *SINCE, "--all", "--format", "json"], capsys)[:2] == (0, out)  # as `mbridge audit list`
    assert [(row["vm"], row["source"], row["drained"], row["ended"], row["silent"]) for row in rows] == [
        ("web-0", "agent", "yes", "", False),
        ("web-1", "centre", "yes", "", True),
        ("web-2", "agent", "restored", "completed", False),
    ]
    assert rows[0]["event_id"] == EVENT_ID
    assert rows[0]["not_before"] == "2026-03-01T12:15:00Z"
    assert rows[0]["cloud"] == "azure"

    code, out, _ = fleet([*flags, *SINCE, "--vm", "web-2", "--all", "--wide"], capsys)
    assert code == 0
    (row,) = out.splitlines()[1:]
    assert row.split()[:2] == ["web-2", THIRD]
    assert row.split()[-1] == "completed"

    code, out, _ = fleet([*flags, *SINCE, "--vm", "web-2"], capsys)
    assert (code, out.splitlines()[1:]) == (0, [])


def test_since_leaves_out_older_records(logged: tuple[World, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    world, flags = logged
    maintenance(world)

    code, out, _ = fleet([*flags, "--since", "2026-03-01T13:00:00Z", "--all"], capsys)

    assert (code, out.splitlines()[1:]) == (0, [])


def test_a_window_larger_than_the_limit_is_refused_not_shown_in_part(
    logged: tuple[World, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    world, flags = logged
    maintenance(world)
    count = len(world.store.query())

    code, out, err = fleet([*flags, *SINCE, "--limit", str(count - 1)], capsys)
    assert (code, out) == (2, "")
    assert f"more than {count - 1} audit records since 2026-03-01T00:00:00Z" in err
    assert "--since" in err
    assert "--limit" in err

    assert fleet([*flags, *SINCE, "--limit", str(count)], capsys)[0] == 0


def test_bad_flags_and_a_missing_database_say_what_to_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = fleet(["--db", str(tmp_path / "none.db")], capsys)
    assert code == 2
    assert "no audit database at" in err

    code, _, err = fleet(["--db", str(tmp_path / "none.db"), "--since", "yesterday"], capsys)
    assert code == 2
    assert "--since 'yesterday'" in err
    assert "30m, 12h, 7d" in err


def hostile(vm: str, event_id: str, **detail: Any) -> list[AuditRecord]:
    """A report and a drain as an old or tampered log may hold them."""
    sender = {"sender": "reported by x", **detail}
    return [
        AuditRecord(START, AuditKind.EVENT, "env", event_id, vm, status="scheduled", detail=sender),
        AuditRecord(START, AuditKind.ACTION, "env", event_id, vm, action="drain"),
    ]


def test_hostile_values_never_break_the_table(
    logged: tuple[World, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN records whose texts carry terminal escapes, newlines, a bidirectional override, wide and
    # combining characters, thousands of characters, and a NotBefore and kind that are not what they say
    world, flags = logged
    world.store.append_all(
        [
            *hostile("evil\x1b[2J\nvm\r", "E\x07-1", kind="reboot\ttab", not_before="not a time"),
            *hostile("\u202eliam", "E-2", kind=["not", "text"], not_before=12),
            *hostile("ウェブ-0", "E-3" + "x" * 5000, kind="a" * 3000),
            *hostile("web-0" + "\u0301" * 40, "E-4"),
        ]
    )

    # WHEN the fleet is shown, narrow and wide
    for wide in ([], ["--wide"]):
        code, out, _ = fleet([*flags, *SINCE, *wide], capsys)

        # THEN it is one line per row, with no control character, every line as wide as its cells say
        lines = out.splitlines()
        assert code == 0
        assert len(lines) == 5
        assert all(char.isprintable() for line in lines for char in line)
        assert max(width(line) for line in lines) < 400
        assert "evil\\x1b[2J\\x0avm\\x0d" in out
        assert "\\u202eliam" in out
        assert "…" in out
        # aligned: the DRAINED column starts at the same terminal column on every line
        starts = {width(line[: line.index("yes")]) for line in lines[1:]}
        assert starts == {width(lines[0][: lines[0].index("DRAINED")])}


def test_a_cell_escapes_and_cuts_to_its_width() -> None:
    assert cell("web-0", 10) == "web-0"
    assert cell("a\\b", 10) == "a\\\\b"
    assert cell("x" * 50, 10) == "x" * 9 + "…"
    assert width(cell("ウ" * 50, 10)) <= 10
    assert cell("\U0001f600", 10) == "\U0001f600"
    assert cell("\x00\x7f\u200b\U000e0001", 40) == "\\x00\\x7f\\u200b\\U000e0001"
