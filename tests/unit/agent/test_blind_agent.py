"""An agent that cannot read its metadata service says so: it is not ready, and the metric the
critical alert reads carries a sample from the start (docs/alerts.example.yml,
`MbridgeMetadataPollsFailing`). Real agent, real health server, a metadata URL nobody answers on,
then the simulator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from simulator import Simulator
from tests.agent_runner import AgentThread, settings_for
from tests.peers import free_port
from tests.waiting import wait_until

VM = "vm-0"


def _health(url: str, tmp_path: Path, agent_thread: Callable[..., AgentThread]) -> str:
    port = free_port()
    settings = replace(settings_for("azure", url, VM, tmp_path), listen=("127.0.0.1", port), identity_proof="none")
    agent_thread(settings)
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: _answers(base), 20, "the agent's health server")
    return base


def _answers(base: str) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=2).status_code in (200, 503)
    except requests.ConnectionError:
        return False


def _gauge(base: str, name: str) -> list[float]:
    text = requests.get(f"{base}/metrics", timeout=2).text
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == name
        for sample in family.samples
    ]


def test_an_agent_that_never_read_its_metadata_service_is_not_ready_and_its_alert_can_fire(
    tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    # GIVEN an agent whose metadata URL nobody answers on
    base = _health(f"http://127.0.0.1:{free_port()}", tmp_path, agent_thread)
    wait_until(lambda: requests.get(f"{base}/readyz", timeout=2).status_code == 503, 10, "/readyz to answer 503")

    # WHEN its health is asked
    ready = requests.get(f"{base}/readyz", timeout=2)

    # THEN it is not ready, and says why
    assert ready.status_code == 503
    assert "metadata service" in ready.text
    # ... the last good poll is exported as never (0): `time() - it > 90` holds, so the alert fires
    assert _gauge(base, "mbridge_last_good_poll_timestamp_seconds") == [0.0]
    (since,) = _gauge(base, "mbridge_seconds_since_last_good_poll")
    assert since >= 0


def test_an_agent_is_ready_once_its_metadata_service_answered(
    tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    # GIVEN an agent watching a metadata service that answers
    with Simulator(cloud="azure", vm_names=[VM]) as sim:
        base = _health(sim.base_urls[0], tmp_path, agent_thread)

        # WHEN it has read it once
        wait_until(lambda: _gauge(base, "mbridge_last_good_poll_timestamp_seconds") != [0.0], 20, "a good poll")

        # THEN it is ready, and the last good poll is a real time
        assert requests.get(f"{base}/readyz", timeout=2).status_code == 200
        (last,) = _gauge(base, "mbridge_last_good_poll_timestamp_seconds")
        assert last > 1_700_000_000
