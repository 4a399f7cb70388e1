"""`python -m bench [--quick] [--out FILE.json] [--only SECTION ...]`: measure, then write the figures.

Run from the repository root. Each section measures one thing (docs/performance.md lists them,
their targets and the last full run's figures); a section that fails is reported with its error
and the others still run. Exit status: 0 when every section ran (missed targets are reported in
the JSON and on stderr, not hidden behind the exit code), 1 when a section failed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

from bench.context import BenchContext
from bench.results import ROOT, Figure, SectionResult, report

# name → module with `run(context) -> list[Figure]`, in the order they run
SECTIONS: dict[str, str] = {
    "detection": "bench.detection",
    "reference": "bench.reference_poller",
    "footprint": "bench.footprint",
    "end_to_end": "bench.end_to_end",
    "throughput": "bench.throughput",
    "fan_in": "bench.fan_in",
    "ordering": "bench.ordering_flood",
    "fleet": "bench.fleet",
}


def run_section(name: str, context: BenchContext) -> SectionResult:
    start = time.monotonic()
    try:
        module = importlib.import_module(SECTIONS[name])
        section: Callable[[BenchContext], list[Figure]] = module.run
        figures = section(context)
    except Exception as error:  # a failed section is reported; the others still run
        traceback.print_exc()
        return SectionResult(name, time.monotonic() - start, [], f"{type(error).__name__}: {error}")
    return SectionResult(name, time.monotonic() - start, figures)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer samples: the whole run in about 4 minutes")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "latest.json", help="the JSON file")
    parser.add_argument("--only", nargs="+", choices=sorted(SECTIONS), help="run only these sections")
    args = parser.parse_args(argv)
    names = args.only or list(SECTIONS)
    started_at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    results = []
    with tempfile.TemporaryDirectory(prefix="mbridge-bench-") as scratch:
        context = BenchContext(quick=args.quick, workdir=Path(scratch))
        with context.cleanup:
            for name in names:
                print(f"bench: {name} ...", file=sys.stderr, flush=True)
                result = run_section(name, context)
                results.append(result)
                for figure in result.figures:
                    print(f"bench:   {_line(figure)}", file=sys.stderr, flush=True)
                if result.error:
                    print(f"bench:   FAILED: {result.error}", file=sys.stderr, flush=True)
    document = report("quick" if args.quick else "full", started_at, results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    summary = document["summary"]
    print(
        f"bench: {summary['figures']} figures, {summary['targets']} with targets, "
        f"missed: {', '.join(summary['missed']) or 'none'}; wrote {args.out}",
        file=sys.stderr,
    )
    return 1 if summary["failed_sections"] else 0


def _line(figure: Figure) -> str:
    value = "n/a" if figure.value is None else f"{figure.value:.3f}"
    verdict = "" if figure.met is None else ("  ok" if figure.met else "  MISSED")
    target = f" (target {figure.target})" if figure.target else ""
    note = f"  [{figure.note}]" if figure.note else ""
    return f"{figure.name} = {value} {figure.unit}{target}{verdict}{note}"


if __name__ == "__main__":
    sys.exit(main())
