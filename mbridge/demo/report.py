"""How the demo shows what happened: a live line per stage, a summary table, the checks, and a
self-contained HTML page (table + SVG chart, no scripts, no external files).

The chart has one row per VM of each flow, a time axis with ticks, and a marker per stage. The
first stages of a flow come milliseconds apart (detected, published, decided, drained) on an
axis of seconds, so a marker is never drawn over another: markers too close to their neighbour
are moved right along the row, in time order, each joined by a leader to a tick at its true time.
This keeps every row one line high and the stages in reading order; stacking close markers in
lanes would do the same with rows three or four lanes high, and segments between successive
marks would be less than a pixel wide for stages a few milliseconds apart.

The chart is drawn twice, for a wide and a narrow screen (a CSS media query shows one): both
scale to the page's width (viewBox), and text stays legible down to a 420 px wide window.
"""

from __future__ import annotations

import heapq
import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TextIO

from mbridge.demo.play import Result, Verdict
from mbridge.demo.timeline import LIVE_STAGES, STAGES, EventTimeline
from wire.version import version

# Red is for what went wrong, and the one thing the chart shows going wrong is a refused report:
# "started" is the maintenance taking place as planned, drawn in a neutral grey.
# A live line's stage column: as wide as the longest stage, so that every line's detail starts in
# the same column.
STAGE_WIDTH = max(len(stage) for stage in LIVE_STAGES)
COLOURS = {
    "detected": "#4e79a7",
    "published": "#76b7b2",
    "decided": "#b07aa1",
    "drained": "#f28e2b",
    "approved": "#59a14f",
    "started": "#a0a0a0",
    "completed": "#9c755f",
    "restored": "#edc948",
    "refused": "#d62728",
    "deleted": "#333333",
}
# What a row shows beside the stages, each drawn with a shape of its own (a cross, a square) and
# said in the legend: a report the functions refused (the audit log), the VM deleted by its event
# (the simulator's log: its metadata service stopped answering).
MARKS = {
    "refused": "refused: a report the functions would not act on (the audit log says why)",
    "deleted": "deleted: the VM is gone, deleted by its maintenance",
}


class LiveLines:
    """The live narration: one line per stage (time since the demo began, flow, stage, detail, and the
    milliseconds since the flow's maintenance was injected) and what the demo says it does.

    Lines are printed in the order things happened, not in the order the demo learns of them: its
    witnesses are read at different delays (on the Pub/Sub variant the audit log is queried from
    Firestore, the envelopes pulled from a subscription, the approvals read from the simulator), and
    within a poll each witness is read in turn. So each line is stamped with its witness's time (what
    the demo says itself: the time it says it), held for `hold` seconds (the world's witness lag), and
    lines are printed in time order as their hold ends: `flush` (the play calls it as it polls),
    `flush(everything=True)` where nothing earlier can come any more. A line learnt later than its hold
    is still printed, with its own time."""

    def __init__(
        self, out: TextIO, hold: float = 0.0, now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
    ) -> None:
        self._out = out
        self._now = now
        self._began = now()
        self.hold = hold
        self._held: list[tuple[datetime, int, str]] = []
        self._told = 0

    def say(self, text: str, at: datetime | None = None) -> None:
        when = self._now() if at is None else at
        self._told += 1
        heapq.heappush(self._held, (when, self._told, text))
        self.flush()

    def stage(self, timeline: EventTimeline, stage: str, detail: str, when: datetime) -> None:
        elapsed = timeline.ms_since_injection(when)
        since = f"  (+{elapsed:,.0f} ms)" if elapsed is not None and stage != "injected" else ""
        self.say(f"  {timeline.key:<18} {stage:<{STAGE_WIDTH}} {detail}{since}", when)

    def flush(self, everything: bool = False) -> None:
        due = self._now() - timedelta(seconds=self.hold)
        while self._held and (everything or self._held[0][0] <= due):
            when, _, text = heapq.heappop(self._held)
            print(f"[{(when - self._began).total_seconds():6.2f}s] {text}", file=self._out, flush=True)


def summary(result: Result) -> list[str]:
    """The table of elapsed milliseconds per stage, then every check."""
    header = f"{'flow':<18}" + "".join(f"{stage:>11}" for stage in STAGES) + "  end"
    lines = ["", "milliseconds from injection to each stage:", header, "-" * len(header)]
    for timeline in result.timelines:
        cells = "".join(f"{_ms(timeline.elapsed_ms(stage)):>11}" for stage in STAGES)
        lines.append(f"{timeline.key:<18}{cells}  {timeline.ended_as or '-'}")
    lines.append("")
    for verdict in result.verdicts:
        mark = "✓" if verdict.failure is None else "✗"
        seen = "" if verdict.failure is None else f"  — seen: {verdict.failure}"
        lines.append(f"  {mark} {verdict.title}: {verdict.expectation}{seen}")
    held = sum(verdict.failure is None for verdict in result.verdicts)
    lines.append("")
    lines.append(f"{held}/{len(result.verdicts)} expectations held in {result.seconds:.1f} s")
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def write_html(result: Result, path: str, title: str, notes: Sequence[str]) -> None:
    with open(path, "w", encoding="utf-8") as page:
        page.write(render_html(result, title, notes))


# The two drawings of the chart: (name, viewBox width, font size, marker radius). The narrow one
# is shown below NARROW_SCREEN_PX; at a 420 px window its text is drawn at about 12 px high.
WIDE = ("wide", 1000.0, 13.0, 6.0)
NARROW = ("narrow", 440.0, 14.0, 5.5)
NARROW_SCREEN_PX = 640


def run_date(result: Result) -> datetime:
    """When the run began: its first injection, else now (a run that injected nothing)."""
    injected = [t.injected_at for t in result.timelines if t.injected_at is not None]
    return min(injected) if injected else datetime.now(timezone.utc)


def render_html(result: Result, title: str, notes: Sequence[str]) -> str:
    rows = "".join(
        "<tr><th>{}</th>{}<td>{}</td></tr>".format(
            html.escape(t.key),
            "".join(f"<td>{_ms(t.elapsed_ms(stage))}</td>" for stage in STAGES),
            html.escape(t.ended_as or "-"),
        )
        for t in result.timelines
    )
    checks = "".join(_check_item(verdict) for verdict in result.verdicts)
    status = "passed" if result.passed else "FAILED"
    head = "".join(f"<th>{stage}</th>" for stage in STAGES)
    notes_html = "".join(f"<li>{html.escape(note)}</li>" for note in notes)
    legend = "".join(
        f'<li><span class="swatch" style="background:{COLOURS[stage]}"></span>{stage}</li>' for stage in STAGES
    ) + "".join(f'<li><span class="swatch {mark}"></span>{html.escape(text)}</li>' for mark, text in MARKS.items())
    date = run_date(result).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    charts = "".join(_svg_chart(layout(result.timelines, *drawing)) for drawing in (WIDE, NARROW))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; }}
th:first-child {{ text-align: left; }}
.ok {{ color: #2e7d32; }} .fail {{ color: #c62828; font-weight: bold; }}
.meta {{ color: #555; }}
.scroll {{ overflow-x: auto; }}
.chart {{ display: block; width: 100%; height: auto; max-width: 1000px; }}
.chart.narrow {{ display: none; }}
.legend {{ list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 4px 16px; }}
.swatch {{ display: inline-block; width: 11px; height: 11px; border-radius: 50%; margin-right: 5px; }}
.swatch.deleted {{ border-radius: 0; background: {COLOURS["deleted"]}; }}
.swatch.refused {{ border-radius: 0; background: linear-gradient(45deg, transparent 40%, {COLOURS["refused"]} 40%,
  {COLOURS["refused"]} 60%, transparent 60%), linear-gradient(-45deg, transparent 40%, {COLOURS["refused"]} 40%,
  {COLOURS["refused"]} 60%, transparent 60%); }}
@media (max-width: {NARROW_SCREEN_PX}px) {{
  body {{ margin: 0.75em; }}
  .chart.wide {{ display: none; }}
  .chart.narrow {{ display: block; }}
}}
</style></head><body>
<h1>{html.escape(title)}: {status}</h1>
<p class="meta">run of {date}; maintenance-bridge {html.escape(version())}</p>
<p>{sum(v.failure is None for v in result.verdicts)}/{len(result.verdicts)} expectations held;
the flows took {result.seconds:.1f} s. Times are from the moment each maintenance was
injected into the metadata simulator; each row is one VM of a flow.</p>
<ul class="legend">{legend}</ul>
{charts}
<div class="scroll"><table><tr><th>flow</th>{head}<th>end</th></tr>{rows}</table></div>
<h2>Expectations</h2><ul>{checks}</ul>
<ul>{notes_html}</ul>
</body></html>
"""


def _check_item(verdict: Verdict) -> str:
    if verdict.failure is None:
        return f'<li class="ok">✓ {html.escape(verdict.title)}: {html.escape(verdict.expectation)}</li>'
    return (
        f'<li class="fail">✗ {html.escape(verdict.title)}: {html.escape(verdict.expectation)}'
        f" — seen: {html.escape(verdict.failure)}</li>"
    )


@dataclass(frozen=True)
class ChartRow:
    """One row of the chart: a VM's part of a flow (vm None: a flow no VM's own witness marked)."""

    flow: str
    vm: str | None
    marks: tuple[tuple[str, float], ...]  # (stage, ms since injection), in time order
    ended_as: str | None

    @property
    def label(self) -> str:
        name = self.flow if self.vm is None else f"{self.flow} · {self.vm}"
        kinds = {stage for stage, _ in self.marks}
        if not kinds:
            return f"{name}: no stage reached"
        notes = [self.ended_as] if self.ended_as else []
        if "deleted" in kinds:
            notes.append("VM deleted")
        if "refused" in kinds and not kinds & set(STAGES):
            notes.append("refused")
        return f"{name}: {', '.join(notes)}" if notes else name


def chart_rows(timelines: Sequence[EventTimeline]) -> list[ChartRow]:
    """One row per VM whose own witnesses marked a stage of the flow, or that a refused report
    names, in VM order, with its stages, its refusals and its deletion; a flow with none still gets
    a row, so every flow of the table is on the chart."""
    rows: list[ChartRow] = []
    for timeline in timelines:
        refusals = {refusal.vm for refusal in timeline.refusals}
        vms: list[str | None] = [*sorted(set(timeline.vm_stages) | refusals)] or [None]
        for vm in vms:
            if vm is None:
                seen = [(s, timeline.elapsed_ms(s)) for s in STAGES]
            else:
                seen = [(s, timeline.vm_elapsed_ms(vm, s)) for s in (*STAGES, "deleted")]
                seen += [("refused", timeline.ms_since_injection(r.time)) for r in timeline.refusals if r.vm == vm]
            marks = sorted(((s, ms) for s, ms in seen if ms is not None), key=lambda mark: mark[1])
            rows.append(ChartRow(timeline.key, vm, tuple(marks), timeline.ended_as))
    return rows


@dataclass(frozen=True)
class Marker:
    row: int
    stage: str
    ms: float
    true_x: float  # where its time is on the axis
    x: float  # where it is drawn: true_x, or moved right off a neighbour
    y: float
    r: float


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class ChartLayout:
    name: str
    width: float
    height: float
    font: float
    left: float
    right: float
    axis_y: float
    rows: tuple[tuple[ChartRow, float, float], ...]  # (row, label baseline, track y)
    ticks: tuple[Tick, ...]
    markers: tuple[Marker, ...]


def layout(timelines: Sequence[EventTimeline], name: str, width: float, font: float, r: float) -> ChartLayout:
    """Where everything goes on a chart `width` units wide: pure, so its geometry can be tested."""
    rows = chart_rows(timelines)
    left, right = r + 2, width - r - 2
    longest = max((ms for row in rows for _, ms in row.marks), default=0.0)
    step = _tick_step(longest, max(2, int((right - left) // 90)))
    end = max(step, math.ceil(longest / step) * step)
    scale = (right - left) / end
    axis_y = font + 10
    ticks = tuple(Tick(left + value * scale, _tick_label(value, step)) for value in _tick_values(end, step))
    placed: list[tuple[ChartRow, float, float]] = []
    markers: list[Marker] = []
    y = axis_y + 8
    for index, row in enumerate(rows):
        label_y, track_y = y + font, y + font + r + 6
        placed.append((row, label_y, track_y))
        true = [left + ms * scale for _, ms in row.marks]
        for (stage, ms), true_x, x in zip(row.marks, true, _spread(true, 2 * r + 2, left, right)):
            markers.append(Marker(index, stage, ms, true_x, x, track_y, r))
        y = track_y + r + 8
    return ChartLayout(name, width, y + 4, font, left, right, axis_y, tuple(placed), ticks, tuple(markers))


def _spread(xs: Sequence[float], gap: float, left: float, right: float) -> list[float]:
    """Positions for markers at `xs` (ascending): as close to their own as can be, each at least
    `gap` from the one before, all within [left, right]. Right first, then back from the right end."""
    out: list[float] = []
    for x in xs:
        out.append(max(x, left, out[-1] + gap) if out else max(x, left))
    for index in range(len(out) - 1, -1, -1):
        limit = right if index == len(out) - 1 else out[index + 1] - gap
        out[index] = min(out[index], limit)
    return out


def _tick_step(span_ms: float, most: int) -> float:
    """The smallest of 1, 2 or 5 times a power of ten (ms) that gives at most `most` intervals over `span_ms`."""
    raw = max(span_ms, 1.0) / most
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _tick_values(end: float, step: float) -> list[float]:
    return [index * step for index in range(round(end / step) + 1)]


def _tick_label(value: float, step: float) -> str:
    return f"{value / 1000:g} s" if step >= 100 else f"{value:g} ms"


def _svg_chart(chart: ChartLayout) -> str:
    font, w, h = chart.font, chart.width, chart.height
    parts = [
        f'<svg class="chart {chart.name}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w:g} {h:.0f}" '
        f'width="100%" preserveAspectRatio="xMinYMin meet" role="img" '
        f'aria-label="time from injection to each stage, one row per VM of each flow" font-size="{font:g}">'
    ]
    for tick in chart.ticks:
        anchor = "start" if tick is chart.ticks[0] else "end" if tick is chart.ticks[-1] else "middle"
        parts.append(
            f'<line class="grid" x1="{tick.x:.1f}" y1="{chart.axis_y:.0f}" x2="{tick.x:.1f}" y2="{h - 4:.0f}" '
            f'stroke="#e4e4e4"/>'
            f'<text class="tick" x="{tick.x:.1f}" y="{chart.axis_y - 4:.0f}" text-anchor="{anchor}" '
            f'fill="#555">{tick.label}</text>'
        )
    parts.append(
        f'<line x1="{chart.left:.1f}" y1="{chart.axis_y:.0f}" x2="{chart.right:.1f}" y2="{chart.axis_y:.0f}" '
        f'stroke="#888"/>'
    )
    for index, (row, label_y, track_y) in enumerate(chart.rows):
        parts.append(f'<text class="row" x="{chart.left:.1f}" y="{label_y:.0f}">{html.escape(row.label)}</text>')
        mine = [m for m in chart.markers if m.row == index]
        if mine:
            last = max(max(m.x, m.true_x) for m in mine)
            parts.append(
                f'<line x1="{chart.left:.1f}" y1="{track_y:.1f}" x2="{last:.1f}" y2="{track_y:.1f}" '
                f'stroke="#bbb" stroke-width="2"/>'
            )
        for marker in mine:
            bottom = track_y + marker.r + 3
            parts.append(
                f'<line x1="{marker.true_x:.1f}" y1="{bottom:.1f}" x2="{marker.true_x:.1f}" y2="{bottom - 3:.1f}" '
                f'stroke="{COLOURS[marker.stage]}" stroke-width="1.5"/>'
            )
            if abs(marker.x - marker.true_x) > 0.5:
                parts.append(
                    f'<line x1="{marker.true_x:.1f}" y1="{bottom - 3:.1f}" x2="{marker.x:.1f}" y2="{track_y:.1f}" '
                    f'stroke="{COLOURS[marker.stage]}" stroke-width="1"/>'
                )
        for marker in mine:
            who = row.flow if row.vm is None else f"{row.flow}, {row.vm}"
            parts.append(_marker(index, marker, f"{html.escape(who)}: {marker.stage} at {marker.ms:,.0f} ms"))
    parts.append("</svg>")
    return "".join(parts)


def _marker(row: int, marker: Marker, title: str) -> str:
    """A stage as a dot; a refusal as a cross, a deletion as a square: they read apart at a glance."""
    x, y, r, colour = marker.x, marker.y, marker.r, COLOURS[marker.stage]
    data = f'class="marker" data-row="{row}" data-stage="{marker.stage}"'
    if marker.stage == "refused":
        d = r * 0.8
        return (
            f'<path {data} d="M{x - d:.1f} {y - d:.1f}L{x + d:.1f} {y + d:.1f}M{x + d:.1f} {y - d:.1f}L{x - d:.1f} '
            f'{y + d:.1f}" stroke="{colour}" stroke-width="2.5" stroke-linecap="round" fill="none">'
            f"<title>{title}</title></path>"
        )
    if marker.stage == "deleted":
        side = r * 1.7
        return (
            f'<rect {data} x="{x - side / 2:.1f}" y="{y - side / 2:.1f}" width="{side:.1f}" height="{side:.1f}" '
            f'fill="{colour}" stroke="#fff" stroke-width="1"><title>{title}</title></rect>'
        )
    return (
        f'<circle {data} cx="{x:.1f}" cy="{y:.1f}" r="{r:g}" fill="{colour}" stroke="#fff" stroke-width="1">'
        f"<title>{title}</title></circle>"
    )
