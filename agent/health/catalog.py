"""Every metric the agent exports, described in one place: docs/operations.md#metrics lists them,
and docs/alerts.example.yml may name only these (tests/unit/agent/test_metrics_alerts.py)."""

from __future__ import annotations

from agent.health.metrics import ERROR_KINDS, Metrics, resident_memory_bytes


def agent_metrics() -> Metrics:
    """A registry with every metric the agent exports described (HELP, TYPE), the error kinds at
    0 and the process's memory; the agent's parts add their series as they run."""
    metrics = Metrics()
    metrics.describe("mbridge_polls_total", "counter", "Metadata reads by result (changed, unchanged, error).")
    metrics.describe("mbridge_errors_total", "counter", "Errors by kind.")
    metrics.describe("mbridge_hook_runs_total", "counter", "Hook command runs, by result (ok, failed, timeout, error).")
    metrics.describe(
        "mbridge_hook_dropped_total",
        "counter",
        "Maintenance changes the hook was not run for (queue full, or stopping).",
    )
    metrics.describe("mbridge_hook_duration_seconds", "histogram", "How long each hook run took.")
    metrics.describe(
        "mbridge_unreadable_fields_total",
        "counter",
        "Envelopes forwarded with a field of the cloud's entry this release could not read, by field.",
    )
    metrics.describe("mbridge_events_published_total", "counter", "Envelopes the bus accepted, by type.")
    metrics.describe(
        "mbridge_unproven_messages_total",
        "counter",
        "Messages published without a proof of this VM's identity (the metadata service gave none in time, "
        "or refused it).",
    )
    metrics.describe(
        "mbridge_events_not_forwarded_total",
        "counter",
        "Events of other VMs seen in the metadata and not published (--forward own).",
    )
    metrics.describe("mbridge_commands_total", "counter", "Commands answered, by result.")
    metrics.describe("mbridge_outbox_depth", "gauge", "Envelopes waiting for the bus.")
    metrics.describe(
        "mbridge_seconds_since_last_good_poll", "gauge", "Seconds since the metadata service last answered."
    )
    metrics.describe(
        "mbridge_detection_lag_seconds",
        "histogram",
        "Upper bound of how long a change was visible in the metadata service before the agent saw it.",
    )
    metrics.describe(
        "mbridge_publish_lag_seconds", "histogram", "From observing a change to the bus accepting its envelope."
    )
    metrics.describe(
        "mbridge_build_info", "gauge", "Always 1; the labels name the release, the cloud and the transport."
    )
    metrics.describe(
        "mbridge_last_good_poll_timestamp_seconds",
        "gauge",
        "When the metadata service last answered (Unix time, seconds).",
    )
    metrics.describe(
        "mbridge_maintenance_pending",
        "gauge",
        "1 per maintenance event of this VM that is scheduled or started (gone once completed or canceled).",
    )
    metrics.describe(
        "mbridge_command_path_open",
        "gauge",
        "1 while the agent holds its command path (an open event, a drain, a held command, or the linger "
        "after them); 0 while it holds no bus connection and no receive.",
    )
    metrics.describe("process_resident_memory_bytes", "gauge", "Resident memory size in bytes (Linux only).")
    # Every kind at 0 from the start: rate() and increase() see the first error of each.
    for kind in ERROR_KINDS:
        metrics.inc("mbridge_errors_total", 0.0, kind=kind)
    metrics.gauge("process_resident_memory_bytes", resident_memory_bytes)
    return metrics
