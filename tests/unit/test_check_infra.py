"""scripts/check_infra.py: which checkov reports fail the run.

checkov exits 0 when it cannot parse a file, so the verdict is read from its JSON report.
"""

from __future__ import annotations

from typing import Any

import pytest

from scripts.check_infra import NO_REASON, ToolError, problems_in, reports_of, summary_line


def report(check_type: str, resources: int = 3, **results: list[Any]) -> dict[str, Any]:
    body: dict[str, list[Any]] = {"passed_checks": [], "failed_checks": [], "skipped_checks": [], "parsing_errors": []}
    body.update(results)
    return {
        "check_type": check_type,
        "results": body,
        "summary": {
            "passed": len(body["passed_checks"]),
            "failed": len(body["failed_checks"]),
            "skipped": len(body["skipped_checks"]),
            "parsing_errors": len(body["parsing_errors"]),
            "resource_count": resources,
        },
    }


def skipped(reason: str) -> dict[str, Any]:
    return {
        "check_id": "CKV_GCP_83",
        "resource": "google_pubsub_topic.events",
        "file_path": "/pubsub.tf",
        "check_result": {"result": "SKIPPED", "suppress_comment": reason},
    }


def test_clean_reports_pass() -> None:
    reports = [
        report("terraform", skipped_checks=[skipped("Google-managed keys; set kms_key_name for CMEK")]),
        report("bicep"),
    ]
    assert problems_in(reports) == []


def test_a_parsing_error_fails_even_though_checkov_exits_zero() -> None:
    problems = problems_in([report("terraform"), report("bicep", parsing_errors=["/infra/azure/main.bicep"])])
    assert problems == ["bicep: cannot parse /infra/azure/main.bicep: checkov skipped the whole file"]


def test_a_failed_check_fails_and_names_where() -> None:
    failed = {
        "check_id": "CKV_AZURE_1",
        "check_name": "Ensure something",
        "resource": "azurerm_x.y",
        "file_path": "/terraform/azure/main.tf",
        "file_line_range": [12, 20],
    }
    [problem] = problems_in([report("terraform", failed_checks=[failed]), report("bicep")])
    assert "CKV_AZURE_1 failed on azurerm_x.y (/terraform/azure/main.tf:12)" in problem


@pytest.mark.parametrize("reason", ["", "   ", NO_REASON])
def test_a_skip_without_a_reason_fails(reason: str) -> None:
    [problem] = problems_in([report("terraform", skipped_checks=[skipped(reason)]), report("bicep")])
    assert "skipped on google_pubsub_topic.events" in problem
    assert "without a reason" in problem


def test_a_framework_that_scanned_nothing_fails() -> None:
    problems = problems_in([report("terraform"), report("bicep", resources=0)])
    assert problems == ["bicep: checkov found no resources: is the path right and the framework installed?"]
    assert problems_in([report("terraform")]) == [
        "bicep: checkov found no resources: is the path right and the framework installed?"
    ]


def test_one_report_or_a_list_of_them() -> None:
    single = report("bicep")
    assert reports_of(single) == [single]
    assert reports_of([single, single]) == [single, single]
    with pytest.raises(ToolError, match="unexpected shape"):
        reports_of("no")


def test_summary_line_counts_per_framework() -> None:
    line = summary_line([report("terraform", skipped_checks=[skipped("why")]), report("bicep", resources=7)])
    assert line == (
        "terraform: 3 resources, 0 passed, 0 failed, 1 skipped, 0 parsing errors; "
        "bicep: 7 resources, 0 passed, 0 failed, 0 skipped, 0 parsing errors"
    )
