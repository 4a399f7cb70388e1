"""The live narration is printed in the order things happened, not in the order the demo learnt of
them. The witnesses come with different delays (on the Pub/Sub variant the audit log is read from
Firestore, the envelopes pulled from a subscription, the approvals from the simulator), so a line
is held for the world's witness lag and lines are printed by their witness's time. The clock is
the test's own."""

from __future__ import annotations

import io
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import mbridge.demo
from mbridge.demo.report import LiveLines
from mbridge.demo.timeline import LIVE_STAGES, EventTimeline
from wire.model import Cloud, EventKind

DEMO = Path(mbridge.demo.__file__).parent
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def narration(hold: float) -> tuple[LiveLines, io.StringIO, Clock]:
    out, clock = io.StringIO(), Clock()
    return LiveLines(out, hold=hold, now=clock), out, clock


def reboot() -> EventTimeline:
    return EventTimeline("user-reboot", Cloud.AZURE, EventKind.REBOOT, "E1", injected_at=at(1))


def test_lines_learnt_out_of_order_are_printed_in_the_order_they_happened() -> None:
    live, out, clock = narration(hold=2.0)
    timeline = reboot()
    clock.advance(3)

    # WHEN the approval (IMDS's log, read at once) is learnt before the decision (the audit log, late)
    live.stage(timeline, "approved", "IMDS accepted the POST of web-2", at(2.5))
    live.stage(timeline, "decided", "rule 4-user", at(1.6))
    live.stage(timeline, "detected", "scheduled, by web-2", at(1.4))

    # THEN nothing is printed while a line still could come before them
    assert out.getvalue() == ""
    # AND once the hold is over for all of them, they come in the order they happened
    clock.advance(2)
    live.flush()
    lines = out.getvalue().splitlines()
    assert [line.split()[3] for line in lines] == ["detected", "decided", "approved"]
    # each stamped with its own time since the narration began, and its time since the injection
    assert lines[0].startswith("[  1.40s]")
    assert lines[2].startswith("[  2.50s]")
    assert lines[1].endswith("(+600 ms)")


def test_a_line_is_held_only_for_the_hold() -> None:
    live, out, clock = narration(hold=2.0)
    clock.advance(5)
    live.stage(reboot(), "detected", "scheduled, by web-2", at(4))

    clock.advance(0.9)
    live.flush()
    assert out.getvalue() == ""  # 1.9 s after it happened
    clock.advance(0.2)
    live.flush()
    assert "detected" in out.getvalue()


def test_what_the_demo_says_itself_is_placed_at_the_time_it_says_it() -> None:
    live, out, clock = narration(hold=1.0)
    timeline = reboot()
    clock.advance(2)
    live.say("redeploy-canceled: Azure cancels the Redeploy")  # at 2 s
    live.stage(timeline, "drained", "web-2", at(1.5))  # learnt later, happened before

    live.flush(everything=True)

    lines = out.getvalue().splitlines()
    assert "drained" in lines[0]
    assert "Azure cancels" in lines[1]


def test_without_a_hold_a_line_is_printed_at_once() -> None:
    # While the peers start nothing else is said: progress shows as it happens.
    live, out, clock = narration(hold=0.0)
    clock.advance(4)
    live.say("starting the Pub/Sub and Firestore emulators")

    assert out.getvalue() == "[  4.00s] starting the Pub/Sub and Firestore emulators\n"


def test_a_line_learnt_after_its_hold_is_still_printed() -> None:
    live, out, clock = narration(hold=1.0)
    timeline = reboot()
    clock.advance(5)
    live.stage(timeline, "restored", "web-2", at(4.5))
    live.flush()  # 0.5 s: held
    clock.advance(1)
    live.flush()
    live.stage(timeline, "completed", "completed, seen by web-2", at(3.0))  # 3 s late

    lines = out.getvalue().splitlines()
    assert [line.split()[3] for line in lines] == ["restored", "completed"]


def test_every_stage_s_detail_starts_in_the_same_column() -> None:
    # GIVEN one live line of each stage, the longest ("reported centrally") among them
    live, out, _ = narration(hold=0.0)
    timeline = reboot()
    for stage in LIVE_STAGES:
        live.stage(timeline, stage, "DETAIL", at(1))
    live.flush(everything=True)

    # THEN each line has its stage after the flow, and its detail at one column, one space after the
    # longest stage
    lines = out.getvalue().splitlines()
    assert len(lines) == len(LIVE_STAGES)
    columns = {line.index("DETAIL") for line in lines}
    assert len(columns) == 1
    for line, stage in zip(lines, LIVE_STAGES):
        assert line[: line.index("DETAIL")].rstrip().endswith(f"user-reboot        {stage}")
    widest = max(LIVE_STAGES, key=len)
    assert f"{widest} DETAIL" in lines[LIVE_STAGES.index(widest)]


def test_every_stage_the_demo_tells_is_one_the_live_lines_align() -> None:
    # GIVEN the demo's sources: every stage named where a line is told (a mark, a listener call, the play)
    told = re.compile(r"(?:_mark|_on_stage|\.stage)\(\s*timeline,\s*\"([^\"]+)\"")
    named = {
        stage
        for source in (DEMO / "timeline.py", DEMO / "play.py", DEMO / "report.py")
        for stage in told.findall(source.read_text(encoding="utf-8"))
    }
    # THEN each is in LIVE_STAGES, whose longest sets the column (the search finds them all)
    assert {"reported centrally", "approval sent", "injected", "deleted"} <= named
    assert named <= set(LIVE_STAGES)
