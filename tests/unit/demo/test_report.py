"""What the demo prints and the page it writes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from mbridge.demo.play import Result, Verdict
from mbridge.demo.report import render_html, summary
from mbridge.demo.timeline import EventTimeline
from wire.model import Cloud, EventKind

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def result(failure: str | None = None) -> Result:
    reboot = EventTimeline("platform-reboot", Cloud.AZURE, EventKind.REBOOT, "e1", injected_at=T0, ended_as="completed")
    for stage, ms in (("detected", 210), ("drained", 250), ("approved", 3400), ("restored", 6500)):
        reboot.stages[stage] = T0 + timedelta(milliseconds=ms)
    quiet = EventTimeline("<gce>", Cloud.GCE, EventKind.LIVE_MIGRATE, None, injected_at=T0)
    verdicts = [
        Verdict("platform-reboot", "platform Reboot", "approved after the drain period", None),
        Verdict("<gce>", "GCE <migration>", "drained gce-0", failure),
    ]
    return Result([reboot, quiet], verdicts, seconds=7.25)


def test_the_summary_lists_milliseconds_per_stage_and_every_check() -> None:
    lines = summary(result(failure="drained []"))
    row = next(line for line in lines if line.startswith("platform-reboot"))
    assert row.split() == ["platform-reboot", "210", "-", "-", "250", "3,400", "-", "-", "6,500", "completed"]
    assert "  ✓ platform Reboot: approved after the drain period" in lines
    assert "  ✗ GCE <migration>: drained gce-0  — seen: drained []" in lines
    assert lines[-1] == "1/2 expectations held in 7.2 s"


def test_the_page_is_self_contained_escaped_and_says_whether_it_passed() -> None:
    page = render_html(result(), "demo <embedded>", ["audit log: /tmp/x & y"])
    assert "<script" not in page
    assert "demo &lt;embedded&gt;: passed" in page
    assert "&lt;gce&gt;" in page
    assert "<gce>" not in page
    assert page.count("<circle") == 2 * 4  # one dot per stage seen, in the wide and the narrow chart
    assert "/tmp/x &amp; y" in page
    assert ": FAILED" in render_html(result(failure="drained []"), "demo", [])
