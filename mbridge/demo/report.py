"""How the demo shows what happened: a live line per stage, a summary table, the checks, and a
self-contained HTML page (table + SVG chart, no scripts, no external files)."""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from typing import TextIO

from mbridge.demo.play import Result, Verdict
from mbridge.demo.timeline import STAGES, EventTimeline

COLOURS = {
    "detected": "#4e79a7",
    "published": "#76b7b2",
    "decided": "#b07aa1",
    "drained": "#f28e2b",
    "approved": "#59a14f",
    "started": "#e15759",
    "completed": "#9c755f",
    "restored": "#edc948",
}


class LiveLines:
    """Prints one line per stage as it is seen: time since the demo began, flow, stage, detail,
    and the milliseconds since the flow's maintenance was injected."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._began = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self._began:6.2f}s] {text}", file=self._out, flush=True)

    def stage(self, timeline: EventTimeline, stage: str, detail: str) -> None:
        elapsed = timeline.elapsed_ms(stage)
        since = f"  (+{elapsed:,.0f} ms)" if elapsed is not None else ""
        self.say(f"  {timeline.key:<18} {stage:<13} {detail}{since}")


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
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; }}
th:first-child {{ text-align: left; }}
.ok {{ color: #2e7d32; }} .fail {{ color: #c62828; font-weight: bold; }}
</style></head><body>
<h1>{html.escape(title)}: {status}</h1>
<p>{sum(v.failure is None for v in result.verdicts)}/{len(result.verdicts)} expectations held;
the flows took {result.seconds:.1f} s. Times are milliseconds from the moment each maintenance was
injected into the metadata simulator.</p>
{_svg_chart(result.timelines)}
<table><tr><th>flow</th>{head}<th>end</th></tr>{rows}</table>
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


def _svg_chart(timelines: Sequence[EventTimeline]) -> str:
    """One lane per flow, a dot per stage at its elapsed time, a bar from injection to the last."""
    label_width, lane, width = 150, 34, 900
    longest = max((ms for t in timelines for s in STAGES if (ms := t.elapsed_ms(s)) is not None), default=1.0)
    scale = (width - label_width - 20) / max(longest, 1.0)
    height = lane * len(timelines) + 60
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    for index, timeline in enumerate(timelines):
        y = 20 + index * lane + lane / 2
        parts.append(f'<text x="4" y="{y + 4:.0f}" font-size="12">{html.escape(timeline.key)}</text>')
        points = [(s, ms) for s in STAGES if (ms := timeline.elapsed_ms(s)) is not None]
        if points:
            end = label_width + max(ms for _, ms in points) * scale
            parts.append(
                f'<line x1="{label_width}" y1="{y:.0f}" x2="{end:.1f}" y2="{y:.0f}" stroke="#bbb" stroke-width="2"/>'
            )
        for stage, ms in points:
            x = label_width + ms * scale
            parts.append(
                f'<circle cx="{x:.1f}" cy="{y:.0f}" r="6" fill="{COLOURS[stage]}">'
                f"<title>{html.escape(timeline.key)}: {stage} at {ms:,.0f} ms</title></circle>"
            )
    legend_y = height - 20
    for index, stage in enumerate(STAGES):
        x = label_width + index * 90
        parts.append(f'<circle cx="{x}" cy="{legend_y}" r="5" fill="{COLOURS[stage]}"/>')
        parts.append(f'<text x="{x + 9}" y="{legend_y + 4}" font-size="11">{stage}</text>')
    parts.append(f'<text x="{width - 140}" y="14" font-size="11">0 … {longest:,.0f} ms</text>')
    parts.append("</svg>")
    return "".join(parts)
