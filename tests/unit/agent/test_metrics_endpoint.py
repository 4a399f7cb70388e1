"""/metrics of a running agent, read as Prometheus reads it: the agent runs against the metadata
simulator over HTTP with its real health server, and the page is parsed with prometheus_client's
own text parser, so a name, type or label that a scraper would reject or misread fails here."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from agent.health.metrics import ERROR_KINDS
from simulator import Simulator
from tests.agent_runner import AgentThread, settings_for
from tests.peers import free_port
from tests.waiting import wait_until
from wire.version import version

VM = "vm-0"
EVENT_ID = "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator(cloud="azure", vm_names=[VM]) as simulator:
        yield simulator


@pytest.fixture
def base(sim: Simulator, tmp_path: Path, agent_thread: Callable[..., AgentThread]) -> str:
    """The health server of an agent watching `sim` (jsonl transport, no proof of identity needed)."""
    port = free_port()
    settings = replace(
        settings_for("azure", sim.base_urls[0], VM, tmp_path), listen=("127.0.0.1", port), identity_proof="none"
    )
    agent_thread(settings)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _scrape(url) is not None, 20, "the agent's /metrics")
    return url


def _scrape(base: str) -> dict[str, object] | None:
    try:
        answer = requests.get(f"{base}/metrics", timeout=2)
    except requests.ConnectionError:
        return None
    return {family.name: family for family in text_string_to_metric_families(answer.text)}


def families(base: str) -> dict[str, object]:
    scraped = _scrape(base)
    assert scraped is not None
    return scraped


def samples(base: str, name: str) -> list[Sample]:
    family = families(base).get(name)
    return [] if family is None else list(family.samples)  # type: ignore[attr-defined]


def pending(base: str) -> list[dict[str, str]]:
    return [sample.labels for sample in samples(base, "mbridge_maintenance_pending") if sample.value == 1]


def test_every_metric_parses_with_its_type_and_the_unit_its_name_promises(base: str) -> None:
    # GIVEN a running agent that has polled at least once
    wait_until(lambda: bool(samples(base, "mbridge_last_good_poll_timestamp_seconds")), 20, "a good poll")

    # WHEN /metrics is parsed as Prometheus parses it
    found = families(base)

    # THEN every family has a declared type, and the name says what it counts or measures
    types = {name: family.type for name, family in found.items()}  # type: ignore[attr-defined]
    assert "unknown" not in types.values(), types
    # (the parser strips `_total` from a counter's family name: its samples keep it)
    for name, family in found.items():
        if family.type == "counter":  # type: ignore[attr-defined]
            names = {sample.name for sample in family.samples}  # type: ignore[attr-defined]
            assert names <= {f"{name}_total", f"{name}_created"}, (name, names)
    expected = {
        "mbridge_polls": "counter",
        "mbridge_errors": "counter",
        "mbridge_build_info": "gauge",
        "mbridge_last_good_poll_timestamp_seconds": "gauge",
        "mbridge_outbox_depth": "gauge",
        "mbridge_detection_lag_seconds": "histogram",
        "mbridge_publish_lag_seconds": "histogram",
        "mbridge_maintenance_pending": "gauge",
    }
    assert {name: types.get(name) for name in expected} == expected
    # Linux only: /proc/self/statm is where the agent reads it; elsewhere the series is absent.
    if Path("/proc/self/statm").exists():
        (rss,) = samples(base, "process_resident_memory_bytes")
        assert rss.value > 1_000_000  # a Python process holds megabytes, never a count of pages
    # Unix seconds of the last answer: now, not a monotonic reading nor milliseconds
    (last_poll,) = samples(base, "mbridge_last_good_poll_timestamp_seconds")
    assert abs(last_poll.value - time.time()) < 30


def test_build_info_is_one_with_the_release_cloud_and_transport(base: str) -> None:
    # WHEN /metrics is read THEN build_info is a single 1 labelled with what this agent is
    (info,) = samples(base, "mbridge_build_info")
    assert info.value == 1
    assert info.labels == {"version": version(), "cloud": "azure", "transport": "jsonl"}


def test_every_error_kind_has_a_series_at_zero_before_any_error(base: str) -> None:
    # GIVEN an agent whose metadata service answers (no error yet)
    # WHEN /metrics is read
    errors = {
        sample.labels["kind"]: sample.value
        for sample in samples(base, "mbridge_errors")
        if sample.name.endswith("_total")
    }

    # THEN every known kind is there at 0, so rate() and increase() see the first error of each
    assert errors == dict.fromkeys(ERROR_KINDS, 0.0)


def test_the_pending_gauge_appears_with_an_event_and_disappears_when_it_ends(base: str, sim: Simulator) -> None:
    # GIVEN no maintenance yet
    assert pending(base) == []

    # WHEN an event for this VM is scheduled
    added = requests.post(
        f"{sim.base_urls[0]}/_sim/events",
        json={"event_type": "Reboot", "event_id": EVENT_ID, "resources": [VM]},
        timeout=5,
    )
    added.raise_for_status()

    # THEN one series names it, scheduled
    scheduled = {"event_id": EVENT_ID, "kind": "reboot", "status": "scheduled"}
    wait_until(
        lambda: pending(base) == [scheduled], 20, lambda: f"the pending gauge of {EVENT_ID}, got {pending(base)}"
    )

    # WHEN it starts THEN the same event is one series, now started (never two at once)
    requests.post(f"{sim.base_urls[0]}/_sim/events/{EVENT_ID}/advance", timeout=5).raise_for_status()
    started = {**scheduled, "status": "started"}
    wait_until(lambda: pending(base) == [started], 20, lambda: f"the started series, got {pending(base)}")

    # WHEN it completes (Azure removes it) THEN the series is gone
    requests.post(f"{sim.base_urls[0]}/_sim/events/{EVENT_ID}/advance", timeout=5).raise_for_status()
    wait_until(lambda: pending(base) == [], 20, lambda: f"no pending series, got {pending(base)}")
    assert "mbridge_maintenance_pending{" not in requests.get(f"{base}/metrics", timeout=5).text
