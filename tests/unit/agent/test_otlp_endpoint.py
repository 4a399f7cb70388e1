"""--otlp-endpoint (MBRIDGE_OTLP_ENDPOINT): off by default, at no cost; on, only with its extra.

GIVEN the agent's settings and its start
WHEN  --otlp-endpoint is left out, given, given badly, or given where OpenTelemetry cannot be imported
THEN  it is off by default and an agent that runs, publishes and takes commands loads nothing of
      OpenTelemetry; a URL is taken from the flag or the variable; anything else, or a missing extra,
      stops the start with exit 2 and a line naming the setting and the extra to install.
(Needs no OpenTelemetry: runs on Python 3.9 too. tests/unit/agent/test_otel.py tests the export itself.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from agent.config import ConfigError, add_agent_arguments, settings_from_args
from simulator import Simulator
from tests.agent_runner import ROOT

AZURE = ["--cloud", "azure"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    return parser.parse_args(argv)


def test_it_is_off_by_default_and_takes_a_url_from_the_flag_or_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MBRIDGE_OTLP_ENDPOINT", raising=False)
    assert settings_from_args(parse(AZURE), environ={}).otlp_endpoint is None
    given = settings_from_args(parse([*AZURE, "--otlp-endpoint", "http://127.0.0.1:4318/"]), environ={})
    assert given.otlp_endpoint == "http://127.0.0.1:4318"
    from_env = {"MBRIDGE_OTLP_ENDPOINT": "http://localhost:4318"}
    assert settings_from_args(parse(AZURE), environ=from_env).otlp_endpoint == "http://localhost:4318"


def test_what_is_not_a_url_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError) as refused:
        settings_from_args(parse([*AZURE, "--otlp-endpoint", "127.0.0.1:4318"]), environ={})
    assert str(refused.value).startswith("otlp endpoint (--otlp-endpoint / MBRIDGE_OTLP_ENDPOINT / config key")


# `mbridge agent --otlp-endpoint` where OpenTelemetry cannot be imported (as on an install without
# the extra: a None in sys.modules makes its import fail).
MISSING_PROBE = """
import sys
sys.modules["opentelemetry"] = None
from mbridge.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_its_extra_the_agent_does_not_start_and_says_what_to_install(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            MISSING_PROBE,
            "agent",
            *AZURE,
            "--vm-name",
            "web-0",
            "--state-dir",
            str(tmp_path),
            "--otlp-endpoint",
            "http://127.0.0.1:4318",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("mbridge agent: otlp endpoint (--otlp-endpoint / MBRIDGE_OTLP_ENDPOINT")
    assert "maintenance-bridge[agent-otel]" in line


# An agent on the embedded bus, taking commands, runs until it has published the simulator's event:
# then the modules it loaded are printed. (An endpoint as third argument turns the export on.)
AGENT_PROBE = """
import json, sys, threading, time
from dataclasses import replace
from pathlib import Path
from agent.main import run_agent
from tests.agent_runner import settings_for
from wire.transports.local import LocalBus
url, state = sys.argv[1], Path(sys.argv[2])
endpoint = sys.argv[3] if len(sys.argv) > 3 else None
settings = replace(settings_for("azure", url, "web-0", state), transport="local", otlp_endpoint=endpoint)
stop = threading.Event()
agent = threading.Thread(target=run_agent, args=(settings, stop), daemon=True)
agent.start()
deadline = time.monotonic() + 30
while not LocalBus(settings.bus_path).read_events(0):
    assert time.monotonic() < deadline, "no envelope published"
    time.sleep(0.05)
stop.set()
agent.join(30)
print(json.dumps(sorted(name for name in sys.modules if name.startswith(("opentelemetry", "agent.otel")))))
"""


def loaded_by_an_agent(state_dir: Path, *endpoint: str) -> list[str]:
    """The OpenTelemetry modules (and agent.otel) an agent process loaded by its first publish."""
    with Simulator(cloud="azure", vm_names=["web-0"], speed=10) as sim:
        requests.post(
            f"{sim.base_urls[0]}/_sim/events", json={"event_type": "Reboot", "resources": ["web-0"]}, timeout=5
        ).raise_for_status()
        run = subprocess.run(
            [sys.executable, "-c", AGENT_PROBE, sim.base_urls[0], str(state_dir), *endpoint],
            capture_output=True,
            text=True,
            timeout=90,
            cwd=ROOT,
            check=False,
        )
    assert run.returncode == 0, run.stderr[-2000:]
    loaded: list[str] = json.loads(run.stdout.strip().splitlines()[-1])
    return loaded


def test_with_it_off_an_agent_loads_nothing_of_opentelemetry(tmp_path: Path) -> None:
    assert loaded_by_an_agent(tmp_path / "web-0") == []
