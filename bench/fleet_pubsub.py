"""The fleet benchmark's agents on Google's Pub/Sub emulator: what an idle fleet and engaged VMs hold.

The same virtual agents as bench/fleet.py (bench/fleet_agents.py), each with the real
`PubSubTransport`: its publisher for events, its subscriber (created on the first pull, closed by
`rest()`) for the VM's commands subscription. Subscribers and pulls are counted where the
transport makes them (a counting proxy around the subscriber client).

- Idle: every agent (all 10,000 in the full run) idle for the window: subscribers open (sampled),
  pulls and their calls per VM-hour.
- Engaged: `engaged` VMs get an event each from the simulator's stores; each reads its document,
  publishes its report to the emulator's events topic and opens its command path: subscribers open
  and pulls outstanding are sampled. Every such VM has a commands subscription; the emulator
  ignores subscription filters (every command would be copied to every subscription of a topic),
  so the subscriptions sit on `SHARDS` commands topics chosen with wire/shards.py, as a deployment
  past one topic's limits would. No function runs on the emulator here (the local function host
  reads only the local bus): no commands are sent, the agents pull and find nothing, and the
  notice → approval latency is the local bus's (bench/fleet.py). The pulls outstanding at once are
  bounded by the turn threads of the virtual agents (a pull blocks a thread for up to
  `PUBSUB_PULL_WAIT`); subscribers open is what each agent holds.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.context import BenchContext
from bench.fleet import (
    HOUR,
    LINGER_SECONDS,
    SAMPLE_SECONDS,
    FleetSize,
    MetadataServer,
    MetadataShards,
    Watcher,
    vm_names,
)
from bench.fleet_agents import PUBSUB_PULL_WAIT, FleetSpec, Workers, start_workers
from bench.functions_worlds import warnings_to
from bench.peers import PeerUnavailableError, environment, start_pubsub_emulator
from bench.results import Figure, exactly
from mbridge.demo.world import CommandKeys
from wire.shards import entity_for

PROJECT = "fleet-bench"
EVENTS_TOPIC = "maintenance-events"
EVENTS_SUBSCRIPTION = "fleet-events"
COMMANDS_TOPIC = "maintenance-commands"
SHARDS = 64
ENGAGED = {True: 50, False: 200}  # quick → VMs engaged on Pub/Sub
ENGAGED_WINDOW = {True: 15.0, False: 30.0}
PULL_BATCH = 1000


@dataclass
class PubSubRun:
    agents: int
    idle_seconds: float
    idle_counts: Counter[str]
    idle_subscribers: list[int]
    engaged: int
    engaged_seconds: float
    engaged_counts: Counter[str]
    subscribers: list[int] = field(default_factory=list)
    pulls_outstanding: list[int] = field(default_factory=list)
    reports: int = 0  # the engaged VMs' reports on the events topic


def _open(stats: dict[str, Any]) -> int:
    counts = stats["counts"]
    return int(counts.get("subscribers_opened", 0) - counts.get("subscribers_closed", 0))


def _sample(workers: Workers, seconds: float) -> tuple[list[int], list[int]]:
    subscribers: list[int] = []
    outstanding: list[int] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stats = workers.stats()
        subscribers.append(_open(stats))
        outstanding.append(int(stats["counts"].get("pulls_outstanding", 0)))
        time.sleep(SAMPLE_SECONDS)
    return subscribers, outstanding


def _delta(after: dict[str, Any], before: dict[str, Any]) -> Counter[str]:
    counts = Counter(after["counts"])
    counts.subtract(before["counts"])
    return counts


def _setup_topics(engaged: list[str]) -> Any:
    from google.cloud import pubsub_v1

    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    publisher.create_topic(name=f"projects/{PROJECT}/topics/{EVENTS_TOPIC}")
    subscriber.create_subscription(
        name=f"projects/{PROJECT}/subscriptions/{EVENTS_SUBSCRIPTION}",
        topic=f"projects/{PROJECT}/topics/{EVENTS_TOPIC}",
    )
    topics = {entity_for(COMMANDS_TOPIC, vm, SHARDS) for vm in engaged}
    for topic in sorted(topics):
        publisher.create_topic(name=f"projects/{PROJECT}/topics/{topic}")
    for vm in engaged:
        subscriber.create_subscription(
            name=f"projects/{PROJECT}/subscriptions/commands-{vm}",
            topic=f"projects/{PROJECT}/topics/{entity_for(COMMANDS_TOPIC, vm, SHARDS)}",
        )
    return subscriber


def _count_reports(subscriber: Any) -> int:
    from google.api_core import exceptions as api_errors

    count = 0
    subscription = f"projects/{PROJECT}/subscriptions/{EVENTS_SUBSCRIPTION}"
    while True:
        try:
            response = subscriber.pull(subscription=subscription, max_messages=PULL_BATCH, timeout=2.0, retry=None)
        except api_errors.DeadlineExceeded:
            return count
        received = list(response.received_messages)
        if not received:
            return count
        subscriber.acknowledge(subscription=subscription, ack_ids=[item.ack_id for item in received])
        count += len(received)


def run_pubsub(workdir: Path, size: FleetSize, quick: bool) -> PubSubRun:
    vms = vm_names(size.agents)
    engaged = vms[: ENGAGED[quick]]
    with ExitStack() as stack:
        stack.enter_context(warnings_to(workdir / "warnings.log"))
        emulator = start_pubsub_emulator(workdir)
        stack.callback(emulator.stop)
        stack.enter_context(environment("PUBSUB_EMULATOR_HOST", emulator.host))
        admin = _setup_topics(engaged)
        stack.callback(admin.close)
        shards = MetadataShards(vms)
        server = MetadataServer(shards)
        threading.Thread(target=server.serve_forever, name="fleet-metadata", daemon=True).start()
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        per = -(-len(vms) // size.processes)
        topics = tuple((vm, entity_for(COMMANDS_TOPIC, vm, SHARDS)) for vm in engaged)
        specs = [
            FleetSpec(
                transport="pubsub",
                vms=tuple(vms[start : start + per]),
                state_dir=str(workdir / "agents"),
                metadata_url=server.url,
                verify_key=CommandKeys.generate().public,
                linger_seconds=LINGER_SECONDS,
                threads=size.threads * 4,  # a pull holds its thread
                pubsub_project=PROJECT,
                pubsub_events_topic=EVENTS_TOPIC,
                pubsub_commands_topics=tuple(item for item in topics if start <= vms.index(item[0]) < start + per),
                pubsub_emulator=emulator.host,
                seed=start,
            )
            for start in range(0, len(vms), per)
        ]
        workers = start_workers(specs)
        stack.callback(workers.stop)
        workers.each(("jump", LINGER_SECONDS + 1.0))
        workers.each(("start",))
        stack.enter_context(Watcher(shards, workers))
        before = workers.stats()
        idle_subscribers, _ = _sample(workers, size.idle_window)
        after = workers.stats()
        idle_counts = _delta(after, before)
        for vm in engaged:
            shards.add_reboot(vm)
        subscribers, outstanding = _sample(workers, ENGAGED_WINDOW[quick])
        final = workers.stats()
        return PubSubRun(
            agents=len(vms),
            idle_seconds=size.idle_window,
            idle_counts=idle_counts,
            idle_subscribers=idle_subscribers,
            engaged=len(engaged),
            engaged_seconds=ENGAGED_WINDOW[quick],
            engaged_counts=_delta(final, after),
            subscribers=subscribers,
            pulls_outstanding=outstanding,
            reports=_count_reports(admin),
        )
    raise AssertionError("unreachable")


def pubsub_figures(run: PubSubRun) -> list[Figure]:
    prefix = "fleet.pubsub"
    idle = run.idle_counts
    idle_hours = run.agents * run.idle_seconds / HOUR
    setup = (
        f"{run.agents} virtual agents with the real PubSubTransport on the emulator; idle {run.idle_seconds:g} s, "
        f"then {run.engaged} VMs with an event each for {run.engaged_seconds:g} s (subscriptions on {SHARDS} "
        "sharded commands topics; no function on the emulator, so no commands)"
    )
    engaged_pulls = run.engaged_counts["pulls"]
    return [
        Figure(
            f"{prefix}.idle_subscribers_open",
            float(max(run.idle_subscribers, default=0)),
            "count",
            exactly(0),
            f"most subscriber clients (gRPC channels for the command pull) open at once while every agent was idle; "
            f"{setup}",
            len(run.idle_subscribers),
        ),
        Figure(
            f"{prefix}.idle_pulls_per_vm_hour",
            idle["pulls"] / idle_hours,
            "count",
            exactly(0),
            f"pulls by idle agents per VM-hour ({idle['pulls']} pulls, {idle['turns_idle']} idle turns, "
            f"{idle['rest_calls']} rest()); {setup}",
            idle["turns_idle"],
        ),
        Figure(
            f"{prefix}.idle_calls_per_vm_hour",
            (idle["ledger_calls"] + idle["rest_calls"] + idle["receive_calls"]) / idle_hours,
            "count",
            None,
            f"ledger reads, rest() and receives of idle agents' command loops per VM-hour; {setup}",
            idle["turns_idle"],
        ),
        Figure(
            f"{prefix}.engaged_subscribers_open_peak",
            float(max(run.subscribers, default=0)),
            "count",
            exactly(run.engaged),
            f"most subscriber clients open at once with {run.engaged} VMs engaged (one each, none for the idle rest); "
            f"{setup}",
            len(run.subscribers),
        ),
        Figure(
            f"{prefix}.engaged_pulls_outstanding_peak",
            float(max(run.pulls_outstanding, default=0)),
            "count",
            None,
            f"most pulls in flight at once (bounded by the harness's turn threads; each pull waits up to "
            f"{PUBSUB_PULL_WAIT:g} s); {setup}",
            len(run.pulls_outstanding),
        ),
        Figure(
            f"{prefix}.engaged_pulls_per_vm_hour",
            engaged_pulls / (run.engaged * run.engaged_seconds / HOUR),
            "count",
            None,
            f"pulls per engaged VM-hour ({engaged_pulls} pulls; empty pulls held by the emulator up to the wait; the "
            f"rate is the harness's thread-bound pace, not the agent's); {setup}",
            engaged_pulls,
        ),
        Figure(
            f"{prefix}.messages_per_event",
            run.reports / max(1, run.engaged),
            "count",
            exactly(1),
            f"reports on the events topic per event (read back through a subscription of the bench's); {setup}",
            run.reports,
        ),
    ]


def run(context: BenchContext, size: FleetSize) -> list[Figure]:
    try:
        pubsub = run_pubsub(context.dir("fleet-pubsub"), size, context.quick)
    except PeerUnavailableError as error:
        return [Figure("fleet.pubsub.idle_pulls_per_vm_hour", None, "count", exactly(0), str(error), 0)]
    return pubsub_figures(pubsub)
