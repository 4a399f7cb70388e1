"""The local demo: the metadata simulator followed by clients written from the vendors' docs.

Azure: the documented live-migration example (Freeze on WestNO_0 and WestNO_1) is polled
once a second, as the Scheduled Events page recommends, and approved with a StartRequests
POST as soon as it is Scheduled; the demo checks that the same EventId goes Scheduled →
Started → gone with DocumentIncarnation 1 → 4. GCE: `maintenance-event` is long-polled with
`wait_for_change` and `last_etag`, and must go NONE → MIGRATE_ON_HOST_MAINTENANCE → NONE.

Exits 0 when every documented step was seen, 1 naming the first that was not.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.simulator import Simulator, load_scenario

SPEED = 60.0
AZURE_API = "2020-07-01"
DEADLINE_SECONDS = 60.0


def main() -> int:
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:6.2f}s] {text}", flush=True)

    failure = run_azure(say) or run_gce(say)
    if failure:
        say(f"FAILED: {failure}")
        return 1
    say("every documented step was seen: OK")
    return 0


def run_azure(say: Callable[[str], None]) -> str | None:
    with Simulator(cloud="azure", speed=SPEED, scenario=load_scenario("azure-live-migration")) as sim:
        url = f"{sim.base_urls[0]}/metadata/scheduledevents"
        headers = {"Metadata": "true"}
        say(f"Azure IMDS simulator for {', '.join(sim.vm_names)} at {sim.base_urls[0]} (speed {SPEED:g}x)")
        seen: list[Any] = []
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline:
            document = requests.get(url, headers=headers, params={"api-version": AZURE_API}, timeout=5).json()
            if not seen or document["DocumentIncarnation"] != seen[-1]["DocumentIncarnation"]:
                seen.append(document)
                events = document["Events"]
                summary = ", ".join(f"{e['EventId']} {e['EventType']} {e['EventStatus']}" for e in events)
                say(f"  incarnation {document['DocumentIncarnation']}: {summary or 'no events'}")
                for event in events:
                    if event["EventStatus"] == "Scheduled":
                        body = {"StartRequests": [{"EventId": event["EventId"]}]}
                        answer = requests.post(
                            url, headers=headers, params={"api-version": AZURE_API}, json=body, timeout=5
                        )
                        say(f"  approved {event['EventId']}: HTTP {answer.status_code}")
                if len(seen) > 1 and not events:
                    break
            time.sleep(1.0)
        approvals = sim.approvals()
    statuses = [[e["EventStatus"] for e in d["Events"]] for d in seen]
    ids = {e["EventId"] for d in seen for e in d["Events"]}
    if [d["DocumentIncarnation"] for d in seen] != [1, 2, 3, 4]:
        return f"expected DocumentIncarnation 1, 2, 3, 4; saw {[d['DocumentIncarnation'] for d in seen]}"
    if statuses != [[], ["Scheduled"], ["Started"], []] or len(ids) != 1:
        return f"expected one EventId going Scheduled → Started → gone; saw {statuses} with ids {sorted(ids)}"
    if [a["status"] for a in approvals] != [200]:
        return f"expected exactly one accepted approval in the simulator's log; saw {approvals}"
    say("Azure: one EventId, Scheduled → Started → gone, approved once: OK")
    return None


def run_gce(say: Callable[[str], None]) -> str | None:
    with Simulator(cloud="gce", speed=SPEED, scenario=load_scenario("gce-live-migrate")) as sim:
        url = f"{sim.base_urls[0]}/computeMetadata/v1/instance/maintenance-event"
        headers = {"Metadata-Flavor": "Google"}
        say(f"GCE metadata simulator for {', '.join(sim.vm_names)} at {sim.base_urls[0]} (speed {SPEED:g}x)")
        # A direct query first: GCE skips the 60-second warning for VMs that never asked.
        first = requests.get(url, headers=headers, timeout=5)
        values, etag = [first.text], first.headers["ETag"]
        say(f"  maintenance-event = {first.text} (ETag {etag})")
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline and values[-3:] != ["NONE", "MIGRATE_ON_HOST_MAINTENANCE", "NONE"]:
            answer = requests.get(
                url,
                headers=headers,
                params={"wait_for_change": "true", "last_etag": etag, "timeout_sec": "10"},
                timeout=15,
            )
            if answer.status_code == 503:  # the docs: retry 503 during maintenance
                time.sleep(0.2)
                continue
            if answer.headers["ETag"] != etag:
                etag = answer.headers["ETag"]
                values.append(answer.text)
                say(f"  maintenance-event = {answer.text} (ETag {etag})")
    if values[-3:] != ["NONE", "MIGRATE_ON_HOST_MAINTENANCE", "NONE"]:
        return f"expected maintenance-event NONE → MIGRATE_ON_HOST_MAINTENANCE → NONE; saw {values}"
    say("GCE: live migration announced and finished, seen through the long-poll: OK")
    return None


if __name__ == "__main__":
    sys.exit(main())
