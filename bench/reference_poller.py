"""The yardstick: the Azure docs' Python sample for Scheduled Events, against the same simulator.

The docs (Scheduled Events, Linux, api-version 2020-07-01, "Python Sample") poll IMDS once a
second with `requests` (`Metadata: true`, the api-version as a query parameter), wait for a new
DocumentIncarnation, then go through every event of the document: log the Started ones, approve
user-initiated events and short Freezes, log the rest. `poll_forever` below is that loop, written
from the description and kept as plain as the sample: no session, no retries, no timeout, no
state beyond the last incarnation. The one addition is a JSON line per processed document with
the moment it was parsed, which is when the sample has first seen what the document shows.

Run as a script (`python bench/reference_poller.py BASE_URL`) it is a process of its own that
imports only what the sample imports, so its CPU time per poll is the sample's. The benchmark
feeds it Platform Reboots, which the sample only logs: it never approves anything here.

As a benchmark section (`run`), it reports the reference's own detection latency and CPU time per
poll, and the ratios ours / reference, from the same run as `detection.azure`: the agent and the
reference poll one simulator side by side (bench/agent_detection.py).
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import requests

if TYPE_CHECKING:
    from bench.context import BenchContext
    from bench.results import Figure

HEADER = {"Metadata": "true"}  # "This must be sent otherwise the request will be ignored"
QUERY_PARAMS = {"api-version": "2020-07-01"}
POLL_SECONDS = 1  # "Poll every second to see if there are new scheduled events to process"
QUICK_FREEZE_SECONDS = 9  # the sample approves Freezes shorter than this at once


# --------------------------------------------------------------------------- the sample's loop


def get_scheduled_events(metadata_url: str) -> Any:
    resp = requests.get(metadata_url, headers=HEADER, params=QUERY_PARAMS)  # noqa: S113 - as the sample: no timeout
    return resp.json()


def confirm_scheduled_event(metadata_url: str, event_id: str) -> int:
    payload = json.dumps({"StartRequests": [{"EventId": event_id}]})
    response = requests.post(metadata_url, headers=HEADER, params=QUERY_PARAMS, data=payload)  # noqa: S113
    return response.status_code


def log(event: dict[str, Any]) -> None:
    print(event["Description"])


def handle(metadata_url: str, event: dict[str, Any]) -> None:
    """The sample's decision for one event of a new document."""
    if event["EventStatus"] == "Started":
        log(event)
    elif event["EventSource"] == "User":  # noqa: SIM114 - the sample's two reasons, kept apart
        confirm_scheduled_event(metadata_url, event["EventId"])
    elif event["EventType"] == "Freeze" and 0 <= int(event["DurationInSeconds"]) < QUICK_FREEZE_SECONDS:
        confirm_scheduled_event(metadata_url, event["EventId"])
    else:
        log(event)


def poll_forever(base_url: str) -> None:
    metadata_url = base_url.rstrip("/") + "/metadata/scheduledevents"
    last_document_incarnation = -1
    while True:
        time.sleep(POLL_SECONDS)
        payload = get_scheduled_events(metadata_url)
        seen_at = time.time()
        found_document_incarnation = payload["DocumentIncarnation"]
        if found_document_incarnation == last_document_incarnation:
            continue
        last_document_incarnation = found_document_incarnation
        for event in payload["Events"]:
            handle(metadata_url, event)
        # The sample prints "Processed events from document: N"; this says the same, with the time.
        record = {
            "seen_at": seen_at,
            "incarnation": found_document_incarnation,
            "events": [[event["EventId"], event["EventStatus"]] for event in payload["Events"]],
        }
        print(json.dumps(record), flush=True)


# --------------------------------------------------------------------------- the benchmark section


def run(context: BenchContext) -> list[Figure]:
    # Imported here, not at the top: the script's process must load only what the sample loads.
    from bench.agent_detection import AZURE_POLL_INTERVAL, azure_run
    from bench.agent_process import describe_threads
    from bench.results import Figure, latency_figures

    azure = azure_run(context)
    same_run = (
        f"{azure.changes} changes at random phases, the agent and the reference polling one simulator "
        f"every {AZURE_POLL_INTERVAL:g} s side by side (the run behind detection.azure)"
    )
    notes = "; ".join([same_run, *azure.notes])
    ours, reference = azure.agent, azure.reference
    per_poll = {role: seconds * 1000 / max(ours.polls, 1) for role, seconds in azure.agent_threads.items()}
    figures = latency_figures(
        "reference.detection",
        reference.latencies_ms,
        note=f"the docs' sample: from the simulator's change to the sample parsing a document that shows it; {notes}",
    )
    figures.append(
        Figure(
            "reference.cpu_per_poll",
            reference.cpu_ms_per_poll,
            "ms/poll",
            None,
            f"user+system CPU of the sample's process over {reference.polls} polls (the simulator's request count); "
            f"/proc/<pid>/stat: {reference.cpu_ticks} ticks",
            reference.polls,
        )
    )
    figures.append(
        Figure(
            "reference.agent_cpu_per_poll",
            ours.cpu_ms_per_poll,
            "ms/poll",
            None,
            f"our agent (transport local) over the same window, {ours.polls} polls; /proc/<pid>/stat: {ours.cpu_ticks} "
            f"ticks; {describe_threads(per_poll, ours.cpu_ms_per_poll or 0.0)}; the window holds the changes, so "
            "the agent's publishing (the outbox written with fsync, the proof of identity, the bus) is in it too",
            ours.polls,
        )
    )
    figures.append(_ratio_p99(ours.latencies_ms, reference.latencies_ms, notes))
    figures.append(_ratio("reference.cpu_per_poll_ratio", ours.cpu_ms_per_poll, reference.cpu_ms_per_poll, notes))
    return figures


def _ratio_p99(ours: list[float], reference: list[float], notes: str) -> Figure:
    from bench.results import Figure, percentile

    if not ours or not reference:
        return Figure("reference.detection_p99_ratio", None, "ratio", None, f"no latencies to compare; {notes}")
    ours_p99, reference_p99 = percentile(ours, 0.99), percentile(reference, 0.99)
    note = (
        f"ours {ours_p99:.1f} ms (to the envelope on the bus) / reference {reference_p99:.1f} ms "
        f"(to a parsed document); {notes}"
    )
    return Figure("reference.detection_p99_ratio", ours_p99 / reference_p99, "ratio", None, note, len(ours))


def _ratio(name: str, ours: float | None, reference: float | None, notes: str) -> Figure:
    from bench.results import Figure

    if ours is None or not reference:
        return Figure(name, None, "ratio", None, f"nothing to compare; {notes}")
    return Figure(
        name, ours / reference, "ratio", None, f"ours {ours:.3f} / reference {reference:.3f} ms/poll; {notes}"
    )


if __name__ == "__main__":
    poll_forever(sys.argv[1])  # until SIGTERM
