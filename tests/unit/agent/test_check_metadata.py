"""`mbridge agent --check` against a metadata service that throttles or cannot be reached.

IMDS answers 429 to more than 5 requests a second from a VM, counting every process on it: one 429
is "not now", so the check asks again after a bounded backoff (as a running agent does) instead of
giving up at once; and what it says when it does give up fits the failure: throttling is not a
proxy or a firewall. The waits are recorded, never slept."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from agent.check import METADATA_RETRY_DELAYS, check, metadata_hint
from agent.config import AgentSettings, settings_from_args
from agent.sources.http import MetadataUnavailableError
from mbridge.cli import build_parser
from simulator import Simulator
from tests.unit.agent.test_settings_check import check_named, free_port

VM = "vm-0"


def settings(metadata_url: str, state_dir: Path) -> AgentSettings:
    argv = [
        "agent", "--check", "--cloud", "azure", "--metadata-url", metadata_url, "--vm-name", VM,
        "--identity-proof", "none", "--transport", "jsonl", "--state-dir", str(state_dir), "--listen", "off",
    ]  # fmt: skip
    return settings_from_args(build_parser("agent").parse_args(argv))


@pytest.fixture
def azure() -> Iterator[Simulator]:
    with Simulator(cloud="azure", vm_names=[VM]) as sim:
        yield sim


def answer_429(sim: Simulator, count: int) -> None:
    response = requests.post(
        f"{sim.base_urls[0]}/_sim/faults", json={"error_burst": {"status": 429, "count": count}}, timeout=5
    )
    assert response.status_code < 300, response.text


def run_check(config: AgentSettings) -> tuple[int, str, list[float]]:
    out, waits = io.StringIO(), list[float]()
    code = check(config, out, sleep=waits.append)
    return code, out.getvalue(), waits


def test_one_429_is_asked_again_after_a_short_wait(
    clean_env: pytest.MonkeyPatch, azure: Simulator, tmp_path: Path
) -> None:
    # GIVEN IMDS throttling this VM's next request
    answer_429(azure, 1)

    # WHEN the check reads the metadata service
    code, out, waits = run_check(settings(azure.base_urls[0], tmp_path))

    # THEN it asked again once, after the first of its waits, and all is well
    assert code == 0, out
    assert check_named(out, "metadata service")[0] == "ok"
    assert waits == [METADATA_RETRY_DELAYS[0]]


def test_throttling_that_does_not_pass_is_said_to_be_throttling_after_bounded_waits(
    clean_env: pytest.MonkeyPatch, azure: Simulator, tmp_path: Path
) -> None:
    # GIVEN IMDS answering 429 to every request the check will make
    answer_429(azure, 100)

    # WHEN the check reads the metadata service
    code, out, waits = run_check(settings(azure.base_urls[0], tmp_path))

    # THEN the whole check waited each of its bounded waits once, and then said the service throttles
    assert waits == list(METADATA_RETRY_DELAYS)
    assert sum(METADATA_RETRY_DELAYS) <= 10
    verdict, text = check_named(out, "metadata service")
    assert verdict == "PROBLEM"
    assert "throttl" in text
    assert "429" in text
    assert "proxy" not in text
    assert "firewall" not in text
    assert code == 1  # it may pass: not the configuration's fault


def test_a_service_that_refuses_connections_gets_the_proxy_and_firewall_hint_at_once(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # GIVEN nothing listening where the metadata service should be
    code, out, waits = run_check(settings(f"http://127.0.0.1:{free_port()}", tmp_path))

    # THEN it does not wait on a refused connection, and says where to look
    assert waits == []
    verdict, text = check_named(out, "metadata service")
    assert verdict == "PROBLEM"
    assert "proxy" in text
    assert "firewall" in text
    assert "throttl" not in text
    assert code == 1


@pytest.mark.parametrize(
    ("kind", "says", "not_said"),
    [
        ("timeout", "firewall", "throttl"),
        ("connection", "firewall", "throttl"),
        ("rate_limited", "throttl", "firewall"),
        ("server_error", "failing", "firewall"),
    ],
)
def test_each_kind_of_failure_gets_the_hint_that_fits_it(kind: str, says: str, not_said: str) -> None:
    hint = metadata_hint(MetadataUnavailableError(kind, "GET /x: something"))

    assert says in hint
    assert not_said not in hint
