"""The report's chart reads at a glance: no marker hides another, an axis with ticks and units, a
chart that scales to the screen, a row per VM, the run's date and version, no negative times."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from mbridge.demo.play import Result
from mbridge.demo.report import NARROW, WIDE, chart_rows, layout, render_html
from mbridge.demo.timeline import STAGES, EventTimeline
from wire.model import Cloud, EventKind
from wire.version import version

T0 = datetime(2026, 11, 22, 12, 0, 0, 250_400, tzinfo=timezone.utc)


def at(ms: float) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def reboot_of_two() -> EventTimeline:
    """A platform Reboot of web-0 and web-1 whose first four stages are milliseconds apart."""
    timeline = EventTimeline("platform-reboot", Cloud.AZURE, EventKind.REBOOT, "e1", injected_at=T0)
    timeline.ended_as = "completed"
    for vm, shift in (("web-0", 0), ("web-1", 2)):
        marks = dict(zip(STAGES, (445, 449, 498, 499, 3504, 3946, 5946, 5986)))
        timeline.vm_stages[vm] = {stage: at(ms + shift) for stage, ms in marks.items()}
    timeline.stages = dict(timeline.vm_stages["web-0"])
    return timeline


def gce_migration() -> EventTimeline:
    timeline = EventTimeline("gce-migration", Cloud.GCE, EventKind.LIVE_MIGRATE, "g1", injected_at=T0)
    timeline.ended_as = "completed"
    # detected in the injection's own millisecond (written rounded down), decided 1 ms later
    marks = {"detected": at(-0.4), "published": at(0.6), "decided": at(1.6), "drained": at(2.6)}
    marks.update({"completed": at(1067), "restored": at(1122)})
    timeline.vm_stages["gce-0"] = marks
    timeline.stages = dict(marks)
    return timeline


def forged() -> EventTimeline:
    return EventTimeline("forged-reboot", Cloud.AZURE, EventKind.REBOOT, "f1", injected_at=T0)


TIMELINES = [reboot_of_two(), gce_migration(), forged()]


def test_each_vm_of_a_flow_has_its_own_row_and_a_flow_without_stages_still_has_one() -> None:
    rows = chart_rows(TIMELINES)
    assert [(row.flow, row.vm) for row in rows] == [
        ("platform-reboot", "web-0"),
        ("platform-reboot", "web-1"),
        ("gce-migration", "gce-0"),
        ("forged-reboot", None),
    ]
    assert [len(row.marks) for row in rows] == [8, 8, 6, 0]
    assert rows[3].label == "forged-reboot: no stage reached"


def test_no_duration_is_negative() -> None:
    # A witness rounded down to its millisecond, or stamped by another clock, may read as before
    # the injection: the chart and the table show 0 ms, never a negative duration.
    timeline = gce_migration()
    assert timeline.elapsed_ms("detected") == 0.0
    timeline.stages["detected"] = at(-3)  # a clock a few ms behind the system clock
    assert timeline.elapsed_ms("detected") == 0.0
    assert all(ms >= 0 for row in chart_rows(TIMELINES) for _, ms in row.marks)
    page = render_html(Result(TIMELINES), "demo", [])
    assert not re.search(r"<td>-\d", page)
    assert not re.search(r"at -\d", page)


@pytest.mark.parametrize("drawing", [WIDE, NARROW])
def test_no_marker_overlaps_another_and_each_stays_in_time_order(drawing: tuple[str, float, float, float]) -> None:
    chart = layout(TIMELINES, *drawing)
    assert len(chart.markers) == 8 + 8 + 6
    for row in range(len(chart.rows)):
        mine = sorted((m for m in chart.markers if m.row == row), key=lambda m: m.ms)
        for before, after in zip(mine, mine[1:]):
            assert after.x - before.x >= before.r + after.r, (row, before, after)
        # moved off its time only as far as its neighbours need (its leader points back to it)
        assert all(abs(m.x - m.true_x) <= len(mine) * (2 * m.r + 2) for m in mine)
    rows = [(m.y - m.r, m.y + m.r) for m in chart.markers]
    assert len({top for top, _ in rows}) == 3  # one line per row
    assert all(m.x - m.r >= 0 and m.x + m.r <= chart.width for m in chart.markers)  # inside the drawing


@pytest.mark.parametrize("drawing", [WIDE, NARROW])
def test_the_axis_has_ticks_with_units_up_to_the_last_stage(drawing: tuple[str, float, float, float]) -> None:
    chart = layout(TIMELINES, *drawing)
    labels = [tick.label for tick in chart.ticks]
    assert labels[0] == "0 s"
    assert all(label.endswith(" s") for label in labels)
    assert 3 <= len(labels) <= 12
    last = float(labels[-1].removesuffix(" s")) * 1000
    assert last >= 5988  # the axis reaches past the latest stage
    assert chart.ticks[-1].x == pytest.approx(chart.right)


def test_an_axis_of_milliseconds_says_ms() -> None:
    quick = gce_migration()
    quick.vm_stages["gce-0"] = {"detected": at(1), "decided": at(35)}
    labels = [tick.label for tick in layout([quick], *WIDE).ticks]
    assert labels[0] == "0 ms"
    assert labels[-1].endswith(" ms")


def test_the_page_scales_its_charts_and_says_when_and_which_release() -> None:
    page = render_html(Result(TIMELINES), "demo", [])
    svgs = re.findall(r"<svg [^>]*>", page)
    assert len(svgs) == 2  # one for wide screens, one for narrow ones
    for svg in svgs:
        assert re.search(r'viewBox="0 0 \d+ \d+"', svg)
        assert 'width="100%"' in svg
        assert "preserveAspectRatio=" in svg
        assert not re.search(r'\swidth="\d+(px)?"', svg)  # no fixed pixel width
    assert "run of 2026-11-22 12:00:00 UTC" in page
    assert f"maintenance-bridge {version()}" in page
    assert "<script" not in page
