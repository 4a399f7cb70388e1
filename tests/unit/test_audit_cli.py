"""`mbridge audit list` for people and for scripts, on the local host's SQLite audit log as the core
itself writes it (`process`, in test_central.py's world, on a database file).

GIVEN web-0's Reboot, drained, approved and put back; a report web-2 forged about web-0 and web-1
      (refused, filed under web-2); and web-1's own Reboot
WHEN  `mbridge audit list` is run by VM or by event, on a terminal or into a pipe
THEN  one VM's view holds every record that names it, as an aligned table on a terminal and as JSON
      lines elsewhere (or as `--format` says), and a VM or event no record names is said on stderr
      with its own exit status.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from functions.core.ports import AuditKind, AuditRecord
from mbridge.audit_cli import NO_RECORD
from mbridge.cli import main
from mbridge.text_table import width
from tests.unit.functions.test_central import EVENT_ID, SET, START, World, reboot
from tests.unit.functions.test_trust import opened
from wire.model import EventStatus

FORGED = "0BADF00D-6E21-4C5A-9B0D-7D3E2F1A9C77"
OTHER = "9A1B2C3D-0000-4000-8000-000000000001"


class Terminal(io.StringIO):
    """Standard output as a terminal shows it: what the command prints when a person reads it."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[tuple[World, list[str]]]:
    """A world whose store (and audit log) is a database file, and the flags that name it."""
    with opened(World, SET, tmp_path / "functions.db") as world:
        yield world, ["--db", str(tmp_path / "functions.db")]


def what_happened(world: World) -> None:
    """web-0's Reboot from scheduled to completed; between them, web-2 reports a Reboot of web-0 and
    web-1 as itself, and web-1's agent its own Reboot."""
    world.report(reboot(EventStatus.SCHEDULED), by="web-0", at=world.clock.now())
    world.clock.advance(60)
    forged = replace(reboot(EventStatus.SCHEDULED, of="web-2"), event_id=FORGED, resources=("web-0", "web-1"))
    world.report(forged, by="web-2", at=world.clock.now())
    world.clock.advance(60)
    world.report(replace(reboot(EventStatus.SCHEDULED, of="web-1"), event_id=OTHER), by="web-1", at=world.clock.now())
    world.clock.advance(600)
    world.report(reboot(EventStatus.COMPLETED), by="web-0", at=world.clock.now())


def audit_list(flags: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["audit", "list", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def on_terminal(flags: list[str], monkeypatch: pytest.MonkeyPatch, columns: int = 160) -> tuple[int, list[str]]:
    """Run `mbridge audit list` with a terminal of `columns` columns as standard output."""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setenv("COLUMNS", str(columns))
    code = main(["audit", "list", *flags])
    monkeypatch.undo()
    return code, terminal.getvalue().splitlines()


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def test_one_vm_s_view_holds_the_report_another_vm_forged_about_it(
    logged: tuple[World, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    world, flags = logged
    what_happened(world)

    # WHEN web-0's records are asked for as JSON
    code, out, err = audit_list([*flags, "--vm", "web-0", "--format", "json"], capsys)

    # THEN they are web-0's own, and the refusal of web-2's report about it, oldest first; not web-1's
    records = lines(out)
    assert (code, err) == (0, "")
    assert {(line["vm"], line["event_id"]) for line in records} == {("web-0", EVENT_ID), ("web-2", FORGED)}
    (forged,) = [line for line in records if line["event_id"] == FORGED]
    assert (forged["kind"], forged["detail"]["resources"]) == ("not-self", ["web-0", "web-1"])
    assert [line["time"] for line in records] == sorted(line["time"] for line in records)
    assert {"drain", "approve", "restore"} <= {line["action"] for line in records}
    # ... and web-1's view holds the same refusal beside its own Reboot
    code, out, _ = audit_list([*flags, "--vm", "web-1", "--format", "json"], capsys)
    assert {(line["vm"], line["event_id"]) for line in lines(out)} == {("web-2", FORGED), ("web-1", OTHER)}


def test_into_a_pipe_it_prints_json_lines_as_it_always_did(
    logged: tuple[World, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    world, flags = logged
    what_happened(world)

    # WHEN standard output is not a terminal (pytest's capture), without --format
    code, out, _ = audit_list([*flags, "--event", FORGED.lower()], capsys)

    # THEN each record is one JSON line, exactly as --format json prints it
    assert code == 0
    assert [(line["kind"], line["vm"]) for line in lines(out)] == [("not-self", "web-2")]
    assert audit_list([*flags, "--event", FORGED.lower(), "--format", "json"], capsys)[1] == out


def test_on_a_terminal_it_prints_a_table_that_says_what_happened_to_the_vm(
    logged: tuple[World, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    world, flags = logged
    what_happened(world)
    count = len(world.store.query_naming("web-0"))

    # WHEN web-0's records are asked for on a terminal
    code, table = on_terminal([*flags, "--vm", "web-0"], monkeypatch)

    # THEN they come as a table: a header, then one line per record, oldest first
    assert code == 0
    assert table[0].split() == ["TIME", "EVENT", "VM", "KIND", "STATUS", "ACTION", "ALSO", "NAMES", "REASON"]
    assert len(table) == 1 + count
    assert table[1].split()[:5] == ["2026-03-01T12:00:00Z", "5DD55B64…", "web-0", "event", "scheduled"]
    # ... the forged report is there, filed under its sender, with the VMs it named
    (forged,) = [line for line in table if line.startswith("2026-03-01T12:01:00Z")]
    assert forged.split()[:7] == [
        "2026-03-01T12:01:00Z", "0BADF00D…", "web-2", "not-self", "scheduled", "none", "web-0,web-1"
    ]  # fmt: skip
    assert "not-self: web-2 reports an event of other VMs" in forged
    # ... what was done to web-0 is in the ACTION column, under its header
    actions = {line[table[0].index("ACTION") :].split()[0] for line in table[1:] if line.split()[3] == "action"}
    assert {"drain", "approve", "restore"} <= actions
    # ... and every line fits the terminal
    assert max(width(line) for line in table) <= 160


def test_the_table_fits_a_narrow_terminal_by_cutting_reasons_and_wide_shows_them_whole(
    logged: tuple[World, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    world, flags = logged
    what_happened(world)
    reason = next(record.reason for record in world.store.query_naming("web-0") if record.kind == "not-self")

    # WHEN the same view is shown on 120 columns, then with --wide
    _, narrow = on_terminal([*flags, "--vm", "web-0"], monkeypatch, columns=120)
    _, wide = on_terminal([*flags, "--vm", "web-0", "--wide"], monkeypatch, columns=120)

    # THEN the narrow one fits, its long reasons cut with "…"; the wide one has them whole, with full
    # event ids and the rule
    assert max(width(line) for line in narrow) == 120
    assert any(line.endswith("…") for line in narrow)
    assert any(line.endswith(reason) for line in wide)
    assert EVENT_ID in "\n".join(wide)
    assert "RULE" in wide[0].split()


def test_the_format_flag_wins_over_what_standard_output_is(
    logged: tuple[World, list[str]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world, flags = logged
    what_happened(world)

    # WHEN JSON is asked for on a terminal, and a table into a pipe
    code, on_tty = on_terminal([*flags, "--vm", "web-1", "--format", "json"], monkeypatch)
    table_code, piped, _ = audit_list([*flags, "--vm", "web-1", "--format", "table"], capsys)

    # THEN each gets what it asked for
    assert (code, table_code) == (0, 0)
    event_ids = [json.loads(line)["event_id"] for line in on_tty]
    assert (event_ids[0], set(event_ids)) == (FORGED, {FORGED, OTHER})
    assert piped.splitlines()[0].split()[0] == "TIME"
    assert len(piped.splitlines()) == 1 + len(on_tty)


def test_a_vm_or_an_event_no_record_names_is_said_with_its_own_exit_status(
    logged: tuple[World, list[str]], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    world, flags = logged
    what_happened(world)

    # WHEN a VM no record names is asked for, an event none is of, and a VM with an event not its own
    asked = [["--vm", "nosuchvm"], ["--event", "NO-SUCH-EVENT"], ["--vm", "web-1", "--event", EVENT_ID]]
    answers = [audit_list([*flags, *flags_of_one], capsys) for flags_of_one in asked]

    # THEN nothing is printed on standard output, stderr says what was not found, and the status
    # is NO_RECORD: neither success nor the status of a log that cannot be read (2)
    assert [(code, out) for code, out, _ in answers] == [(NO_RECORD, "")] * 3
    assert NO_RECORD not in (0, 1, 2)
    assert "no audit record names VM 'nosuchvm'" in answers[0][2]
    assert "no audit record of event 'NO-SUCH-EVENT'" in answers[1][2]
    assert f"no audit record of event {EVENT_ID!r} names VM 'web-1'" in answers[2][2]
    # ... on a terminal too: no table with a header alone
    assert on_terminal([*flags, "--vm", "nosuchvm"], monkeypatch) == (NO_RECORD, [])
    # ... while a log that cannot be read stays 2
    assert audit_list(["--db", str(Path(flags[1]).parent / "none.db"), "--vm", "web-0"], capsys)[0] == 2


def test_hostile_values_never_break_the_table(logged: tuple[World, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN records whose texts carry terminal escapes, newlines and wide characters
    world, flags = logged
    world.store.append_all(
        [
            AuditRecord(START, AuditKind.EVENT, "env", "E\x07-1", "web-0", reason="evil\x1b[2J\nline\r"),
            AuditRecord(START, AuditKind.ACTION, "env", "E-2", "web-0", action="drain", reason="ウェブ" * 80),
        ]
    )

    # WHEN they are shown on a terminal
    code, table = on_terminal([*flags, "--vm", "web-0"], monkeypatch, columns=100)

    # THEN each is one line, with no control character, within the terminal's width
    assert code == 0
    assert len(table) == 3
    assert all(char.isprintable() for line in table for char in line)
    assert "evil\\x1b[2J\\x0aline\\x0d" in table[1]
    assert max(width(line) for line in table) <= 100


def test_a_trace_lists_its_own_records_and_a_value_that_is_no_trace_id_is_refused(
    logged: tuple[World, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    world, flags = logged
    what_happened(world)
    code, out, _ = audit_list([*flags, "--format", "json"], capsys)
    everything = lines(out)
    trace = everything[0]["trace_id"]
    assert code == 0
    assert trace

    # WHEN the records of the first report's trace are asked for, alone and with a VM or event
    code, out, err = audit_list([*flags, "--trace", trace, "--format", "json"], capsys)

    # THEN they are exactly those with that trace id, oldest first
    assert (code, err) == (0, "")
    assert lines(out) == [line for line in everything if line["trace_id"] == trace]
    assert {line["vm"] for line in lines(out)} == {"web-0"}
    assert lines(audit_list([*flags, "--trace", trace, "--vm", "web-0", "--format", "json"], capsys)[1]) == lines(out)
    # ... and with a VM or an event the trace's records do not name, nothing, said as for the others
    code, out, err = audit_list([*flags, "--trace", trace, "--vm", "web-1"], capsys)
    assert (code, out) == (NO_RECORD, "")
    assert f"no audit record of trace {trace} names VM 'web-1'" in err
    code, _, err = audit_list([*flags, "--trace", "1" * 32], capsys)
    assert code == NO_RECORD
    assert f"no audit record of trace {'1' * 32}" in err

    # WHEN the value is not a trace id: upper case, too short, all zeros, a traceparent
    for wrong in [trace.upper(), trace[:31], "0" * 32, f"00-{trace}-{'1' * 16}-01"]:
        with pytest.raises(SystemExit) as exited:
            main(["audit", "list", *flags, "--trace", wrong])
        # THEN it is a usage error (2) that says what a trace id is
        assert exited.value.code == 2
        assert "is not a trace id: 32 lowercase hex digits, not all zeros" in capsys.readouterr().err
