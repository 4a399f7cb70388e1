"""docs/alerts.example.yml names only metrics the agent exports, so the example rules cannot drift
from the metrics when one is renamed or removed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from agent.health.catalog import agent_metrics

RULES = Path(__file__).resolve().parents[3] / "docs" / "alerts.example.yml"
# What Prometheus itself adds to every scrape target.
SCRAPE_SERIES = {"up"}
# PromQL words that are not metric names: functions, aggregations, keywords, duration units.
PROMQL = {
    "time", "rate", "irate", "increase", "delta", "deriv", "absent", "absent_over_time", "changes", "resets",
    "sum", "avg", "min", "max", "count", "topk", "bottomk", "quantile", "histogram_quantile", "max_over_time",
    "min_over_time", "avg_over_time", "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
    "unless", "bool", "offset", "vector", "scalar", "clamp_min", "clamp_max", "label_replace",
}  # fmt: skip


def exported() -> set[str]:
    """Every series name the agent's registry renders, histogram series included."""
    names: set[str] = set()
    for match in re.finditer(r"^# TYPE (\S+) (\S+)$", agent_metrics().render(), re.MULTILINE):
        name, kind = match.groups()
        names.add(name)
        if kind == "histogram":
            names.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: its words without label matchers, strings, ranges,
    numbers and PromQL's own words."""
    bare = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers (their values may contain anything)
    bare = re.sub(r"\[[^\]]*\]", " ", bare)  # range selectors: [5m]
    bare = re.sub(r'"[^"]*"', " ", bare)
    # label lists of aggregations and vector matching: sum by (instance), on (job)
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    return {word for word in words if word not in PROMQL}


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_every_alert_expression_reads_only_metrics_the_agent_exports() -> None:
    # GIVEN the example rules and the names the agent's /metrics renders
    known = exported() | SCRAPE_SERIES

    # WHEN each expression's metric names are read THEN each is one of them
    unknown = {rule["alert"]: metric_names(rule["expr"]) - known for rule in rules()}
    assert {alert: names for alert, names in unknown.items() if names} == {}


def test_the_alerts_cover_what_an_operator_must_be_told() -> None:
    # GIVEN the example rules
    by_metric = {name: rule["alert"] for rule in rules() for name in metric_names(rule["expr"])}

    # THEN there is one for the agent down, failing polls, maintenance without approval and a backlog,
    # each with a severity and a summary
    for metric in (
        "up",
        "mbridge_last_good_poll_timestamp_seconds",
        "mbridge_maintenance_pending",
        "mbridge_outbox_depth",
    ):
        assert metric in by_metric, metric
    for rule in rules():
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


def test_the_name_parser_sees_a_metric_that_does_not_exist() -> None:
    # A check that cannot fail proves nothing: a renamed metric must show up as unknown.
    renamed = 'sum by (instance) (rate(mbridge_polls_renamed_total{result="error"}[5m])) > 0'
    assert metric_names(renamed) == {"mbridge_polls_renamed_total"}
    assert "mbridge_polls_renamed_total" not in exported()


def test_the_rules_in_the_operations_guide_are_those_of_the_file() -> None:
    # GIVEN the YAML block of docs/operations.md's alerts section
    guide = (RULES.parent / "operations.md").read_text()
    section = guide[guide.index("<!-- BEGIN alerts -->") : guide.index("<!-- END alerts -->")]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)

    # THEN it holds the same rules as the file a deployment loads
    assert yaml.safe_load(block) == yaml.safe_load(RULES.read_text())
