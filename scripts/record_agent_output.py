"""Record what the real agent publishes for a few scenarios, as JSON lines, into
tests/fixtures/agent-output/. The replay tests run the policy over these recordings.

Run after a change of the agent's output format, then review the diff.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.main import run_agent  # noqa: E402
from simulator import Simulator, load_scenario  # noqa: E402
from tests.agent_runner import play_to_the_end, settings_for  # noqa: E402

TARGET = ROOT / "tests" / "fixtures" / "agent-output"
PLATFORM_REBOOT = {
    "event_type": "Reboot",
    "resources": ["$0", "$1"],
    "event_id": "A1F7E1C3-0D2B-4E8F-9C51-6B2D0F3E8A44",
    "event_source": "Platform",
}


def record(name: str, sim: Simulator, vm: str) -> None:
    with tempfile.TemporaryDirectory() as state:
        settings = settings_for(sim_cloud(sim), sim.base_urls[sim.vm_names.index(vm)], vm, Path(state))
        stop = threading.Event()
        agent = threading.Thread(target=run_agent, args=(settings, stop))
        agent.start()
        play_to_the_end(sim)
        time.sleep(1.0)
        stop.set()
        agent.join()
        TARGET.mkdir(parents=True, exist_ok=True)
        (TARGET / f"{name}.jsonl").write_text(Path(settings.jsonl_path).read_text())
        print(f"wrote {TARGET / name}.jsonl")


def sim_cloud(sim: Simulator) -> str:
    return str(requests.get(f"{sim.base_urls[0]}/_sim/state", timeout=5).json()["cloud"])


def main() -> int:
    for scenario, name in (
        ("azure-live-migration", "live-migration"),
        ("azure-user-reboot", "user-reboot"),
        ("azure-canceled", "canceled-redeploy"),
    ):
        with Simulator(scenario=load_scenario(scenario)) as sim:
            record(name, sim, sim.vm_names[0])
    with Simulator(cloud="azure", vm_names=["web-0", "web-1"]) as sim:
        body = {**PLATFORM_REBOOT, "resources": ["web-0", "web-1"]}
        requests.post(f"{sim.base_urls[0]}/_sim/events", json=body, timeout=5).raise_for_status()
        record("platform-reboot", sim, "web-0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
