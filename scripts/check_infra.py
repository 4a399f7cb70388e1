"""Validate infra/ offline: `terraform fmt -check`, then checkov over the Terraform and the Bicep.

    python scripts/check_infra.py [--checkov PATH] [--terraform PATH] [--report FILE]

checkov's exit code is not enough: it exits 0 when a file cannot be parsed (the file is then
simply not checked). So this reads checkov's JSON report and fails on

- any failed check (fix it, or skip it inline with a reason: `#checkov:skip=CKV_X:why` in
  Terraform, `// checkov:skip=CKV_X:why` in Bicep),
- any inline skip that gives no reason,
- any parsing error,
- a framework that found no resources (a path or framework typo would otherwise pass).

Exit status: 0 clean, 1 a problem was found (each is printed), 2 a tool is missing or failed.
No provider, compiler or network is needed: checkov runs with --skip-download.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
FRAMEWORKS = ("terraform", "bicep")
# checkov's placeholder when an inline skip has no reason after the colon
NO_REASON = "No comment provided"


class ToolError(Exception):
    """A validation tool is missing or did not produce a report."""


def reports_of(document: Any) -> list[Mapping[str, Any]]:
    """checkov prints one report object for a single framework and a list for several."""
    if isinstance(document, Mapping):
        return [document]
    if isinstance(document, list) and all(isinstance(item, Mapping) for item in document):
        return list(document)
    raise ToolError(f"checkov printed JSON of an unexpected shape: {type(document).__name__}")


def problems_in(reports: Iterable[Mapping[str, Any]], frameworks: Iterable[str] = FRAMEWORKS) -> list[str]:
    """Everything in checkov's reports that must fail the run, one line each."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    for report in reports:
        check_type = str(report.get("check_type", "?"))
        results = report.get("results", {})
        summary = report.get("summary", {})
        seen[check_type] = seen.get(check_type, 0) + int(summary.get("resource_count", 0))
        for path in results.get("parsing_errors", []):
            problems.append(f"{check_type}: cannot parse {path}: checkov skipped the whole file")
        for check in results.get("failed_checks", []):
            problems.append(
                f"{check_type}: {check.get('check_id')} failed on {check.get('resource')} "
                f"({check.get('file_path')}:{_first_line(check)}): {check.get('check_name')}"
            )
        for check in results.get("skipped_checks", []):
            reason = str((check.get("check_result") or {}).get("suppress_comment") or "").strip()
            if not reason or reason == NO_REASON:
                problems.append(
                    f"{check_type}: {check.get('check_id')} is skipped on {check.get('resource')} "
                    f"({check.get('file_path')}) without a reason: write one after the check id"
                )
    for framework in frameworks:
        if not seen.get(framework):
            problems.append(f"{framework}: checkov found no resources: is the path right and the framework installed?")
    return problems


def _first_line(check: Mapping[str, Any]) -> str:
    lines = check.get("file_line_range") or []
    return str(lines[0]) if lines else "?"


def summary_line(reports: Iterable[Mapping[str, Any]]) -> str:
    parts = []
    for report in reports:
        summary = report.get("summary", {})
        parts.append(
            f"{report.get('check_type')}: {summary.get('resource_count', 0)} resources, "
            f"{summary.get('passed', 0)} passed, {summary.get('failed', 0)} failed, "
            f"{summary.get('skipped', 0)} skipped, {summary.get('parsing_errors', 0)} parsing errors"
        )
    return "; ".join(parts)


def terraform_fmt(terraform: str) -> list[str]:
    run = subprocess.run(  # noqa: S603 - a fixed argument list
        [terraform, "fmt", "-check", "-recursive", str(INFRA)],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode == 0:
        return []
    # Exit 3 lists the files that need formatting, one per line.
    changed = [line.strip() for line in run.stdout.splitlines() if line.strip().endswith(".tf")]
    if run.returncode == 3 and changed:
        return [f"terraform fmt: {path} is not formatted: run `terraform fmt -recursive infra`" for path in changed]
    raise ToolError(f"terraform fmt failed ({run.returncode}): {run.stderr.strip()}")


def run_checkov(checkov: str) -> list[Mapping[str, Any]]:
    run = subprocess.run(  # noqa: S603 - a fixed argument list
        [checkov, "-d", str(INFRA), "--framework", *FRAMEWORKS, "--skip-download", "--output", "json", "--compact"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    # 0: nothing failed, 1: checks failed; anything else is checkov itself failing.
    if run.returncode not in (0, 1):
        raise ToolError(f"checkov exited {run.returncode}: {run.stderr.strip()[-2000:]}")
    try:
        return reports_of(json.loads(run.stdout))
    except json.JSONDecodeError as error:
        raise ToolError(
            f"checkov did not print a JSON report ({error}); stderr: {run.stderr.strip()[-2000:]}"
        ) from error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--checkov", default=shutil.which("checkov") or "checkov", help="the checkov executable")
    parser.add_argument("--terraform", default=shutil.which("terraform") or "terraform", help="the terraform binary")
    parser.add_argument("--report", type=Path, help="also write checkov's reports and the verdict to this JSON file")
    args = parser.parse_args(argv)
    try:
        problems = terraform_fmt(args.terraform)
        reports = run_checkov(args.checkov)
    except (ToolError, FileNotFoundError) as error:
        print(f"check_infra: {error}", file=sys.stderr)
        return 2
    problems += problems_in(reports)
    if args.report:
        args.report.write_text(json.dumps({"problems": problems, "reports": reports}, indent=2), encoding="utf-8")
    print(f"check_infra: {summary_line(reports)}")
    for problem in problems:
        print(f"check_infra: {problem}", file=sys.stderr)
    if problems:
        print(f"check_infra: {len(problems)} problem(s) in infra/", file=sys.stderr)
        return 1
    print("check_infra: terraform fmt clean; no failed checks, no unexplained skips, no parsing errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
