"""The demo's report as a browser draws it: headless Chromium renders a report of a whole run's
timelines (recorded from a run of `mbridge demo`, so no demo is played here) at 1400 and 420 px.

At both widths the chart that is shown fits the window (nothing clipped, no horizontal scroll),
its text is drawn at a legible size, and every stage marker of every row is on top where it is
drawn: no other marker covers its centre, and no two markers' boxes overlap. The geometry is
measured by a script added to a copy of the page (the report itself has none), which writes it
into the DOM that `--dump-dom` returns. The copy is shown in an iframe exactly `width` px wide:
headless Chromium lays a page out at least 500 px wide whatever `--window-size` says, while an
iframe's own width is what its media queries and layout see (the iframe is `srcdoc`, so the
page's script may write into the page around it).

Chromium is a peer: Debian's `chromium` package. Missing, the test skips when run by hand and
fails under CI=true.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from mbridge.demo.play import Result, Verdict
from mbridge.demo.report import write_html
from mbridge.demo.timeline import STAGES, EventTimeline
from tests.peers import require_peer
from wire.model import Cloud, EventKind

pytestmark = pytest.mark.peer

CHROMIUM = shutil.which("chromium")
T0 = datetime(2026, 11, 26, 0, 49, 59, 250_000, tzinfo=timezone.utc)

# Milliseconds from injection to each stage, per VM of each flow, as a run of the demo saw them
# (None: not reached). The first four stages of a flow are a few ms apart: the case that hid markers.
RUN: dict[str, dict[str, tuple[int | None, ...]]] = {
    "freeze": {
        "web-0": (430, 434, 447, None, 940, 1430, 3433, None),
        "web-1": (431, 435, 448, None, 938, 1431, 3434, None),
    },
    "user-reboot": {"web-2": (437, 447, 457, 458, 936, 1438, 3440, 3491)},
    "spot-preempt": {"spot-0": (429, 433, 446, 447, 928, 1429, None, None)},
    "scale-in": {"vmss-0": (426, 439, 446, 447, 3449, 3927, None, None)},
    "gce-migration": {"gce-0": (0, 9, 25, 27, None, None, 1074, 1109)},
    "platform-reboot": {
        "web-0": (442, 447, 467, 472, 3480, 3943, 5945, 5995),
        "web-1": (443, 448, 468, 472, 3478, 3944, 5946, 5990),
    },
    "redeploy-canceled": {"web-2": (452, 456, 476, 477, None, None, 953, 986)},
    "gce-terminate": {"gce-0": (3, 7, 9, 10, None, None, 1092, 1140)},
    "forged-reboot": {},
    "genuine-reboot": {"web-0": (403, 405, 443, 448, 3457, 3906, 5907, 5962)},
}

MEASURE = """<script>
const found = {window: innerWidth, page: document.documentElement.scrollWidth, charts: []};
for (const svg of document.querySelectorAll("svg.chart")) {
  const box = svg.getBoundingClientRect();
  if (box.width === 0) continue;  // the drawing for the other screen width
  const scale = box.width / svg.viewBox.baseVal.width;
  let right = 0;
  for (const part of svg.querySelectorAll("line, text, circle")) {
    right = Math.max(right, part.getBoundingClientRect().right);
  }
  const markers = [...svg.querySelectorAll("circle.marker")].map((circle) => {
    const b = circle.getBoundingClientRect();
    const hit = document.elementFromPoint((b.left + b.right) / 2, (b.top + b.bottom) / 2);
    return {row: circle.dataset.row, stage: circle.dataset.stage, fill: circle.getAttribute("fill"),
            left: b.left, right: b.right, top: b.top, bottom: b.bottom,
            onTop: hit === circle || circle.contains(hit)};
  });
  found.charts.push({name: svg.getAttribute("class"), right: right,
                     fontPx: parseFloat(svg.getAttribute("font-size")) * scale, markers: markers});
}
const out = parent.document.createElement("pre");
out.id = "measured";
out.textContent = JSON.stringify(found);
parent.document.body.appendChild(out);
</script>"""


def recorded_result() -> Result:
    timelines = []
    for flow, vms in RUN.items():
        timeline = EventTimeline(flow, Cloud.AZURE, EventKind.REBOOT, flow, injected_at=T0)
        timeline.ended_as = "completed" if vms else None
        for vm, marks in vms.items():
            seen = {stage: T0 + timedelta(milliseconds=ms) for stage, ms in zip(STAGES, marks) if ms is not None}
            timeline.vm_stages[vm] = seen
            for stage, when in seen.items():
                timeline.stages[stage] = min(when, timeline.stages.get(stage, when))
        timelines.append(timeline)
    return Result(timelines, [Verdict(flow, flow, "reached its stages", None) for flow in RUN], seconds=17.1)


def chromium(*args: str) -> str:
    assert CHROMIUM is not None
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (bytes 16 to 24)."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_peer(CHROMIUM is not None, "chromium is not installed (Debian: apt-get install chromium)")
    path = tmp_path_factory.mktemp("report") / "report.html"
    write_html(recorded_result(), str(path), "maintenance-bridge demo (embedded)", ["variant: embedded"])
    return path


def measure(report: Path, width: int) -> dict[str, Any]:
    page = report.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>")
    probe = report.with_name(f"measured-{width}.html")
    probe.write_text(
        f'<!DOCTYPE html><html><body style="margin:0"><iframe style="width:{width}px;height:2400px;border:0" '
        f'srcdoc="{html.escape(page, quote=True)}"></iframe></body></html>',
        encoding="utf-8",
    )
    dom = chromium(f"--window-size={max(width, 1400)},2400", "--dump-dom", probe.as_uri())
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found, "the page's measurements are missing from the DOM"
    measured: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return measured


@pytest.mark.parametrize("width", [1400, 420])
def test_the_chart_fits_the_window_and_every_marker_is_visible(report: Path, width: int) -> None:
    measured = measure(report, width)

    # THEN one chart is shown, fully inside the window, and the page does not scroll sideways
    (chart,) = measured["charts"]
    assert chart["name"] == ("chart wide" if width > 640 else "chart narrow")
    assert chart["right"] <= measured["window"], chart["right"]
    assert measured["page"] <= measured["window"]
    # AND its text is drawn at a legible size
    assert chart["fontPx"] >= 10, chart["fontPx"]
    # AND every stage of every VM's row has its marker, none covered and none overlapping another
    expected = sum(1 for vms in RUN.values() for marks in vms.values() for ms in marks if ms is not None)
    markers = chart["markers"]
    assert len(markers) == expected
    assert [m for m in markers if not m["onTop"]] == []
    for index, one in enumerate(markers):
        for other in markers[index + 1 :]:
            apart = (
                one["right"] <= other["left"] + 0.5
                or other["right"] <= one["left"] + 0.5
                or one["bottom"] <= other["top"] + 0.5
                or other["bottom"] <= one["top"] + 0.5
            )
            assert apart, (one, other)
    # AND each row shows its stages in as many colours as it has stages
    rows: dict[str, set[str]] = {}
    for marker in markers:
        rows.setdefault(marker["row"], set()).add(marker["fill"])
    assert sorted(len(fills) for fills in rows.values()) == sorted(
        sum(ms is not None for ms in marks) for vms in RUN.values() for marks in vms.values()
    )


@pytest.mark.parametrize("width", [1400, 420])
def test_a_screenshot_is_taken_at_the_window_width(report: Path, width: int) -> None:
    shot = report.with_name(f"report-{width}.png")
    chromium(f"--window-size={width},1400", f"--screenshot={shot}", report.as_uri())
    assert png_size(shot) == (width, 1400)
