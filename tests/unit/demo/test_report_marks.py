"""The report draws what a run's expectations are about beyond the eight stages: the functions
refusing a forged report (drawn as "no stage reached" before), a VM deleted by its maintenance;
and "started", which is no error, is not drawn in an error's red."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from mbridge.demo.play import Result
from mbridge.demo.report import COLOURS, MARKS, NARROW, WIDE, chart_rows, layout, render_html
from mbridge.demo.timeline import STAGES, EventTimeline, Refusal
from wire.model import Cloud, EventKind

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def at(ms: float) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def forged() -> EventTimeline:
    timeline = EventTimeline("forged-reboot", Cloud.AZURE, EventKind.REBOOT, "f1", injected_at=T0)
    timeline.forged = ["scheduled of web-0 by web-0, proven by web-2", "scheduled of web-0, web-1 by web-2"]
    timeline.refusals = [
        Refusal("unverified", "the proof is web-2's", "web-0", at(33)),
        Refusal("not-self", "web-2 reports an event of other VMs", "web-2", at(41)),
    ]
    return timeline


def spot_eviction() -> EventTimeline:
    timeline = EventTimeline("spot-preempt", Cloud.AZURE, EventKind.PREEMPT, "s1", injected_at=T0)
    marks = {"detected": at(420), "published": at(425), "decided": at(440), "drained": at(450)}
    marks.update({"approved": at(1020), "started": at(1500), "deleted": at(3520)})
    timeline.vm_stages["spot-0"] = marks
    timeline.stages = dict(marks)
    return timeline


def saturation(colour: str) -> int:
    channels = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    return max(channels) - min(channels)


def test_started_is_drawn_in_a_neutral_colour_and_only_a_refusal_in_red() -> None:
    assert saturation(COLOURS["started"]) <= 0x20  # a grey
    reds = [name for name, colour in COLOURS.items() if int(colour[1:3], 16) > 0xC0 and int(colour[3:5], 16) < 0x70]
    assert reds == ["refused"]


def test_a_refused_forgery_is_drawn_as_refusals_on_the_rows_of_the_vms_they_name() -> None:
    rows = chart_rows([forged()])

    assert [(row.vm, row.marks, row.label) for row in rows] == [
        ("web-0", (("refused", 33.0),), "forged-reboot · web-0: refused"),
        ("web-2", (("refused", 41.0),), "forged-reboot · web-2: refused"),
    ]


def test_a_refusal_beside_the_stages_of_a_genuine_event_goes_on_its_vms_row() -> None:
    genuine = spot_eviction()
    genuine.refusals = [Refusal("unverified", "the proof is web-2's", "spot-0", at(900))]

    (row,) = chart_rows([genuine])

    assert ("refused", 900.0) in row.marks
    times = [ms for _, ms in row.marks]
    assert times == sorted(times)  # in time order among the stages


def test_a_deleted_vm_is_marked_where_its_metadata_service_stopped_answering() -> None:
    (row,) = chart_rows([spot_eviction()])

    assert row.marks[-1] == ("deleted", 3520.0)
    assert row.label == "spot-preempt · spot-0: VM deleted"


@pytest.mark.parametrize("drawing", [WIDE, NARROW])
def test_refusals_and_deletions_have_marks_of_their_own_that_overlap_nothing(
    drawing: tuple[str, float, float, float],
) -> None:
    chart = layout([forged(), spot_eviction()], *drawing)

    assert {m.stage for m in chart.markers} >= {"refused", "deleted"}
    for row in range(len(chart.rows)):
        mine = sorted((m for m in chart.markers if m.row == row), key=lambda m: m.ms)
        for before, after in zip(mine, mine[1:]):
            assert after.x - before.x >= before.r + after.r


def test_the_page_draws_them_with_shapes_of_their_own_and_says_what_they_are() -> None:
    page = render_html(Result([forged(), spot_eviction()]), "demo", [])

    # circles are the stages; a refusal and a deletion are drawn otherwise, in both charts
    assert len(re.findall(r'<circle class="marker"[^>]*data-stage="(?:refused|deleted)"', page)) == 0
    assert len(re.findall(r'<path class="marker"[^>]*data-stage="refused"', page)) == 2 * 2
    assert len(re.findall(r'<rect class="marker"[^>]*data-stage="deleted"', page)) == 2 * 1
    assert "no stage reached" not in page
    legend = re.search(r'<ul class="legend">(.*?)</ul>', page, re.DOTALL)
    assert legend is not None
    for stage in (*STAGES, *MARKS):
        assert f">{stage}" in legend.group(1) or f"> {stage}" in legend.group(1), stage
