"""Drill 3: the metadata service misbehaves in every documented way, on both clouds.

`mbridge agent` runs as a process with its health endpoints on. The simulator's fault injection
(docs/simulator.md, "Faults") plays a storm in stages, in a seeded order with seeded sizes: dropped
connections and 429s, 5xx answers, slow answers, and on Azure garbage bodies. Within a stage every
request the agent makes meets a fault until the stage's faults are used up. On Azure one request
gets through between stages (so the poller's backoff starts again); on GCE the next stage follows at
once. Throughout, the drill probes /healthz and checks the process is alive; afterwards it checks the
request rate, that no worker ever restarted, and that the agent reports what waited through the
storm and what came after it. A relay in front of the simulator times each request when it is sent.

A storm is counted in requests, not seconds, because the agent backs off (up to 5 s): a storm of
seconds would mostly meet an agent that is waiting, and which faults it met would be luck.

The drills at the end pin what the first runs found: a garbled GCE answer that carries a change, a
garbled instance id, values no parser should choke on, and a server that answers long-polls at once.

Builds on tests/contract/agent/test_faults.py (Azure, a thread, one burst of 429 and of 503): here a
process, both clouds, every fault kind in one storm, health probed all along, crash counter read.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from simulator import Simulator
from tests.agent_runner import AgentProcess, AgentThread, read_jsonl, settings_for
from tests.drills.conftest import drill_seed, say
from tests.peers import free_port
from tests.waiting import wait_until

pytestmark = [pytest.mark.drill, pytest.mark.timeout(60)]

SEED = 20261122
CLEAR = {"error_burst": {"status": 503, "count": 0}, "drop": 0, "malformed": 0, "latency_ms": 0}
DETECTION_LIMIT = 15.0  # seconds: the backoff is capped at 5 s on both clouds


@dataclass
class Watch:
    """The agent process and its health endpoint, probed every few hundred milliseconds."""

    agent: AgentProcess
    health_url: str
    answers: Counter[str] = field(default_factory=Counter)

    def probe(self) -> None:
        assert self.agent.process is not None
        if self.agent.process.poll() is not None:
            self.answers["process exited"] += 1
            return
        try:
            self.answers[str(requests.get(self.health_url, timeout=2).status_code)] += 1
        except requests.RequestException:
            self.answers["no answer"] += 1

    def pause(self, seconds: float) -> None:
        """Sleep, probing all along."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.probe()
            time.sleep(min(0.3, max(0.0, deadline - time.monotonic())))

    def metrics(self) -> str:
        return requests.get(self.health_url.replace("/healthz", "/metrics"), timeout=5).text


class RequestRelay:
    """A TCP relay in front of one simulator port that notes the moment each HTTP request starts.

    The simulator's traffic record times a request when it is answered, so on GCE the long-polls sent
    long before count in the second they return. The relay times each request when the agent sends
    it. A request is a header block ending in a blank line (the agent's GETs carry no body)."""

    def __init__(self, target: str, rewrite: tuple[bytes, bytes] | None = None) -> None:
        host, port = target.rsplit("//", 1)[1].split(":")
        self._rewrite = rewrite  # (what, with what) in the requests, same length
        self._target = (host, int(port))
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self.starts: list[float] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def max_per_second(self, since: float = 0.0, until: float = float("inf")) -> int:
        """The most requests sent in any one second (between `since` and `until`, time.monotonic() values)."""
        with self._lock:
            moments = sorted(moment for moment in self.starts if since <= moment <= until)
        best, first = 0, 0
        for last, moment in enumerate(moments):
            while moment - moments[first] >= 1.0:
                first += 1
            best = max(best, last - first + 1)
        return best

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, requests_side: bool) -> None:
        pending = b""
        try:
            while chunk := source.recv(65536):
                if requests_side:
                    if not pending:
                        with self._lock:
                            self.starts.append(time.monotonic())
                    pending += chunk
                    while b"\r\n\r\n" in pending:
                        pending = pending.split(b"\r\n\r\n", 1)[1]
                        if pending:
                            with self._lock:
                                self.starts.append(time.monotonic())
                if requests_side and self._rewrite is not None:
                    chunk = chunk.replace(*self._rewrite)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()


@pytest.fixture
def relay() -> Iterator[Callable[..., RequestRelay]]:
    opened: list[RequestRelay] = []

    def open_relay(target: str, rewrite: tuple[bytes, bytes] | None = None) -> RequestRelay:
        opened.append(RequestRelay(target, rewrite))
        return opened[-1]

    yield open_relay
    for relay in opened:
        relay.close()


def control(sim: Simulator, path: str, body: dict[str, Any]) -> None:
    response = requests.post(f"{sim.base_urls[0]}/_sim/{path}", json=body, timeout=5)
    assert response.status_code < 300, response.text


Stage = tuple[str, dict[str, Any]]


def stages(rng: random.Random, *, garbage: bool) -> list[Stage]:
    """The stages of a storm in a seeded order, with seeded sizes. Without `garbage`, the storm's
    answers are slow instead (the latency stays on through the storm)."""
    error = rng.choice([500, 502, 503, 504])
    found: list[Stage] = [
        ("dropped connections and 429s", {"drop": 1, "error_burst": {"status": 429, "count": rng.randint(2, 3)}}),
        (f"{error}s", {"error_burst": {"status": error, "count": rng.randint(2, 3)}}),
    ]
    if garbage:
        found.append(("slow garbage", {"latency_ms": rng.randint(800, 2500), "malformed": rng.randint(1, 2)}))
    rng.shuffle(found)
    if not garbage:
        slow = {"latency_ms": rng.randint(300, 1500)}
        found = [(f"{name}, slowly", {**body, **slow}) for name, body in found]
    return found


def play(sim: Simulator, vm: str, watch: Watch, stage: Stage, *, settle: bool, timeout: float = 25.0) -> None:
    """Arm one stage and wait, probing the agent's health, until the agent has used its faults up; with
    `settle`, also until one request got through (an Azure poller resets its backoff on a success)."""
    control(sim, "faults", {**CLEAR, **stage[1]})
    deadline = time.monotonic() + timeout
    while _armed(sim, vm):
        assert time.monotonic() < deadline, f"stage {stage[0]} not used up within {timeout} s"
        watch.pause(0.2)
    if settle:
        passed = sim.traffic()[vm]["by_status"].get("200", 0)
        control(sim, "faults", CLEAR)
        while sim.traffic()[vm]["by_status"].get("200", 0) == passed:
            assert time.monotonic() < deadline, f"no request got through after stage {stage[0]}"
            watch.pause(0.2)


def _armed(sim: Simulator, vm: str) -> bool:
    faults = requests.get(f"{sim.base_urls[0]}/_sim/faults", timeout=5).json()[vm]
    return bool(faults["drop"] or faults["error_burst"]["count"] or faults["malformed"])


def start_agent(
    agent_process: Callable[[list[str]], AgentProcess], cloud: str, url: str, vm: str, tmp_path: Path
) -> Watch:
    port = free_port()
    agent = agent_process(["--cloud", cloud, "--metadata-url", url, "--vm-name", vm, "--transport", "jsonl",
                           "--jsonl-path", str(tmp_path / "events.jsonl"), "--state-dir", str(tmp_path / "state"),
                           "--listen", f"127.0.0.1:{port}", "--poll-interval", "0.25"])  # fmt: skip
    watch = Watch(agent, f"http://127.0.0.1:{port}/healthz")
    wait_until(lambda: _answers(watch.health_url), 20, "the agent's /healthz")
    return watch


def reported(tmp_path: Path) -> list[tuple[str, str, str]]:
    return [
        (e["data"]["kind"], e["data"]["status"], e["data"]["event_id"]) for e in read_jsonl(tmp_path / "events.jsonl")
    ]


def crashes(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith('mbridge_errors_total{kind="crash"}'):
            return float(line.split()[-1])
    return 0.0


def errors_by_kind(metrics: str) -> dict[str, int]:
    found = {}
    for line in metrics.splitlines():
        if line.startswith("mbridge_errors_total{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            found[kind] = int(float(line.split()[-1]))
    return found


def test_azure_imds_storm_never_crashes_stays_under_5_per_second_and_reports_once_it_ends(
    tmp_path: Path, agent_process: Callable[[list[str]], AgentProcess], relay: Callable[..., RequestRelay]
) -> None:
    started = time.monotonic()
    seed = drill_seed(SEED)
    rng = random.Random(seed)
    with Simulator(cloud="azure", vm_names=["vm-0"]) as sim:  # IMDS's 5 requests/s limit is on
        # GIVEN an agent polling IMDS every 0.25 s (its own limit: 4 requests/s), through a relay
        # that times each request it sends
        sent = relay(sim.base_urls[0])
        watch = start_agent(agent_process, "azure", sent.url, "vm-0", tmp_path)

        # WHEN a storm of three stages refuses or spoils every request: dropped connections and
        # 429s, 5xx answers, slow garbage (one answer gets through between stages); a Reboot is
        # scheduled after the first stage
        storm = stages(rng, garbage=True)
        waiting = {"event_type": "Reboot", "resources": ["vm-0"], "event_id": "E-DURING", "notice": 3600}
        for index, stage in enumerate(storm):
            play(sim, "vm-0", watch, stage, settle=True)
            if index == 0:
                control(sim, "events", waiting)
        # AND it ends, and a second event is scheduled
        control(sim, "faults", CLEAR)
        calm = time.monotonic()
        control(sim, "events", {**waiting, "event_id": "E-AFTER"})
        wait_until(
            lambda: {e[2] for e in reported(tmp_path)} >= {"E-DURING", "E-AFTER"},
            DETECTION_LIMIT,
            lambda: f"both events reported, got {reported(tmp_path)} (seed {seed})",
        )
        detected_in = time.monotonic() - calm
        # AND the agent goes on as usual: the first event starts and is reported
        requests.post(f"{sim.base_urls[0]}/_sim/events/E-DURING/advance", timeout=5).raise_for_status()
        wait_until(lambda: len(reported(tmp_path)) == 3, 10, lambda: f"the start, got {reported(tmp_path)}")
        watch.pause(0.5)
        traffic = sim.traffic()["vm-0"]
        metrics = watch.metrics()
        most_sent = sent.max_per_second()

    # THEN the process never died and /healthz always answered 200, and no worker ever restarted
    assert set(watch.answers) == {"200"}, f"{dict(watch.answers)} (seed {seed})"
    assert crashes(metrics) == 0, metrics
    # ... IMDS never saw more than 5 requests in any second (counted by the simulator at the answer,
    # and by the relay when sent)
    assert traffic["max_per_second"] <= 5, traffic
    assert most_sent <= 5, most_sent
    # ... and both events were reported, once each, in order
    assert reported(tmp_path) == [
        ("reboot", "scheduled", "E-DURING"),
        ("reboot", "scheduled", "E-AFTER"),
        ("reboot", "started", "E-DURING"),
    ]
    say(
        "faults-azure",
        seed=seed,
        storm=" / ".join(f"{name} {body}" for name, body in storm),
        requests=traffic["total"],
        by_status=traffic["by_status"],
        most_answers_in_a_second=traffic["max_per_second"],
        most_requests_sent_in_a_second=most_sent,
        health_probes=sum(watch.answers.values()),
        errors=errors_by_kind(metrics),
        detected_after_storm_s=round(detected_in, 1),
        duration_s=round(time.monotonic() - started, 1),
    )


def test_gce_metadata_storm_never_crashes_stays_under_5_per_second_and_reports_once_it_ends(
    tmp_path: Path, agent_process: Callable[[list[str]], AgentProcess], relay: Callable[..., RequestRelay]
) -> None:
    started = time.monotonic()
    seed = drill_seed(SEED)
    rng = random.Random(seed)
    with Simulator(cloud="gce", vm_names=["gce-vm-0"]) as sim:
        # GIVEN the agent watching its three keys, each in a long-poll, through a relay that times
        # each request it sends
        sent = relay(sim.base_urls[0])
        watch = start_agent(agent_process, "gce", sent.url, "gce-vm-0", tmp_path)
        # (seven requests: the instance id, then each key read directly and long-polled; the storm
        # must not meet a long-poll on its way, or the migration would go unseen while it lasts)
        wait_until(lambda: len(sent.starts) >= 7, 10, "the agent's three long-polls")
        watch.pause(0.3)

        # WHEN a live migration and a maintenance window are announced (the long-polls return them)
        # AND a storm of two stages meets every request the two watchers make after that, slowly:
        # dropped connections and 429s, 5xx answers (GCE's 503 during maintenance). (Garbage only
        # replaces an answer that carries a value, and a waiting long-poll carries none until a
        # change: garbled GCE answers have a drill of their own below.)
        storm = stages(rng, garbage=False)
        storm_began = time.monotonic()
        control(sim, "faults", {**CLEAR, **storm[0][1]})
        control(sim, "gce", {"key": "maintenance-event", "value": "MIGRATE_ON_HOST_MAINTENANCE"})
        control(sim, "gce", {"key": "upcoming-maintenance", "value": {"window_start_in": 3600}})
        for stage in storm:
            play(sim, "gce-vm-0", watch, stage, settle=False)
        # AND it ends, and the migration ends
        control(sim, "faults", CLEAR)
        calm = time.monotonic()
        control(sim, "gce", {"key": "maintenance-event", "value": "NONE"})
        wait_until(
            lambda: ("live_migrate", "completed") in {e[:2] for e in reported(tmp_path)},
            DETECTION_LIMIT,
            lambda: (
                f"the end of the migration, got {reported(tmp_path)} (seed {seed}); simulator: "
                f"{[e['message'] for e in sim.log_entries()][-12:]}; agent: {watch.agent.log()[-3000:]}"
            ),
        )
        detected_in = time.monotonic() - calm
        # AND the agent goes on as usual: a terminate is announced and reported
        control(sim, "gce", {"key": "maintenance-event", "value": "TERMINATE_ON_HOST_MAINTENANCE"})
        wait_until(lambda: len(reported(tmp_path)) == 4, 10, lambda: f"the terminate, got {reported(tmp_path)}")
        watch.pause(0.5)
        traffic = sim.traffic()["gce-vm-0"]
        metrics = watch.metrics()
        skipped = [e for e in sim.log_entries() if str(e["message"]).startswith("warning skipped")]
        most_sent, most_sent_in_storm = sent.max_per_second(), sent.max_per_second(since=storm_began, until=calm)

    # THEN the process never died and /healthz always answered 200, and no worker ever restarted
    assert set(watch.answers) == {"200"}, f"{dict(watch.answers)} (seed {seed})"
    assert crashes(metrics) == 0, metrics
    # ... through the storm, the agent never sent more than 5 requests in any second (counted by the
    # relay when sent; the simulator counts a long-poll in the second it returns, see RequestRelay).
    # GCE documents no such limit, and outside faults the agent does send more: 7 at start (the
    # instance id, then each key read directly and long-polled), and 2 per change of a key.
    assert most_sent_in_storm <= 5, most_sent_in_storm
    # ... every change was reported: the window once, the migration's two steps under one event id in
    # order, then the terminate; and GCE never had to skip a warning (the agent kept reading the key)
    events = reported(tmp_path)
    assert [e[:2] for e in events if e[0] == "upcoming"] == [("upcoming", "scheduled")]
    maintenance = [e for e in events if e[0] != "upcoming"]
    assert [e[:2] for e in maintenance] == [
        ("live_migrate", "scheduled"),
        ("live_migrate", "completed"),
        ("host_terminate", "scheduled"),
    ]
    assert maintenance[0][2] == maintenance[1][2]
    assert skipped == []
    say(
        "faults-gce",
        seed=seed,
        storm=" / ".join(f"{name} {body}" for name, body in storm),
        requests=traffic["total"],
        by_status=traffic["by_status"],
        most_answers_in_a_second=traffic["max_per_second"],
        most_requests_sent_in_a_second=most_sent,
        most_requests_sent_in_a_second_of_the_storm=most_sent_in_storm,
        health_probes=sum(watch.answers.values()),
        errors=errors_by_kind(metrics),
        detected_after_storm_s=round(detected_in, 1),
        duration_s=round(time.monotonic() - started, 1),
    )


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


# ---------------------------------------------------------------------------------------- found
# What the first runs of this drill found (all fixed): a garbled GCE answer that carried a change was
# kept as the key's reading, a garbled instance id became the identity, a calendar-edge value and a
# lone surrogate killed the agent, and a server answering long-polls at once made it spin.

GCE_VM = "gce-vm-0"


def test_a_garbled_answer_that_carries_a_change_is_read_again_at_once(
    tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    # GIVEN the agent watching maintenance-event in a long-poll
    with Simulator(cloud="gce", vm_names=[GCE_VM]) as sim:
        agent = agent_thread(settings_for("gce", sim.base_urls[0], GCE_VM, tmp_path))
        wait_until(lambda: sim.traffic()[GCE_VM]["total"] >= 4, 10, "the agent's first reads")
        # WHEN the answer that carries a live migration comes back garbled
        control(sim, "faults", {"malformed": 1})
        control(sim, "gce", {"key": "maintenance-event", "value": "MIGRATE_ON_HOST_MAINTENANCE"})
        # THEN the agent reads the key again after its backoff (at most 5 s) and reports the migration
        agent.wait_for_count(1, timeout=8)


def test_a_garbled_instance_id_at_start_up_does_not_change_event_ids(
    tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    with Simulator(cloud="gce", vm_names=[GCE_VM]) as sim:
        # GIVEN an agent whose very first request, instance/id, is answered with garbage
        control(sim, "faults", {"malformed": 1})
        first = agent_thread(settings_for("gce", sim.base_urls[0], GCE_VM, tmp_path))
        wait_until(lambda: sim.traffic()[GCE_VM]["total"] >= 4, 10, "the agent's first reads")
        control(sim, "gce", {"key": "maintenance-event", "value": "MIGRATE_ON_HOST_MAINTENANCE"})
        first.wait_for_count(1)
        # WHEN it restarts during the migration (a clean read this time) and the migration ends
        first.halt()
        second = agent_thread(settings_for("gce", sim.base_urls[0], GCE_VM, tmp_path))
        wait_until(lambda: sim.traffic()[GCE_VM]["total"] >= 9, 10, "the restarted agent's reads")
        control(sim, "gce", {"key": "maintenance-event", "value": "NONE"})
        scheduled, completed = second.wait_for_count(2)
    # THEN both steps carry the same event id
    assert (scheduled["data"]["status"], completed["data"]["status"]) == ("scheduled", "completed")
    assert completed["data"]["event_id"] == scheduled["data"]["event_id"]


def test_an_upcoming_window_at_the_edge_of_the_calendar_does_not_kill_the_agent(
    tmp_path: Path, agent_process: Callable[[list[str]], AgentProcess]
) -> None:
    with Simulator(cloud="gce", vm_names=[GCE_VM]) as sim:
        # GIVEN a running agent
        watch = start_agent(agent_process, "gce", sim.base_urls[0], GCE_VM, tmp_path)
        # WHEN upcoming-maintenance announces a window whose start, in UTC, falls after 9999-12-31
        window = {"windowStartTime": "9999-12-31T23:59:59-23:59"}
        control(sim, "gce", {"key": "upcoming-maintenance", "value": window})
        watch.pause(2.0)
        # THEN the agent refuses the value as malformed and keeps running, healthy
        assert set(watch.answers) == {"200"}, f"{dict(watch.answers)}; log: {watch.agent.log()[-1500:]}"


def test_a_server_that_answers_long_polls_at_once_does_not_make_the_agent_spin(
    tmp_path: Path, agent_process: Callable[[list[str]], AgentProcess], relay: Callable[..., RequestRelay]
) -> None:
    with Simulator(cloud="gce", vm_names=[GCE_VM]) as sim:
        # GIVEN a metadata server that ignores wait_for_change (the relay rewrites it to a value the
        # simulator does not wait on), so every long-poll is answered at once with the same value
        sent = relay(sim.base_urls[0], rewrite=(b"wait_for_change=true", b"wait_for_change=nope"))
        # WHEN the agent watches its keys for two seconds
        watch = start_agent(agent_process, "gce", sent.url, GCE_VM, tmp_path)
        began = time.monotonic()
        watch.pause(2.0)
        most = sent.max_per_second(since=began)
    # THEN it still sends no more than 5 requests in any second
    assert most <= 5, f"{most} requests in one second"


def test_an_event_id_with_a_lone_surrogate_does_not_kill_the_agent(
    tmp_path: Path, agent_process: Callable[[list[str]], AgentProcess]
) -> None:
    with Simulator(cloud="azure", vm_names=["vm-0"]) as sim:
        # GIVEN a running agent
        watch = start_agent(agent_process, "azure", sim.base_urls[0], "vm-0", tmp_path)
        # WHEN IMDS lists an event whose EventId is not valid Unicode text
        body = json.dumps({"event_type": "Reboot", "event_id": "\ud800"})
        requests.post(f"{sim.base_urls[0]}/_sim/events", data=body, timeout=5).raise_for_status()
        watch.pause(2.0)
        # THEN the agent refuses the document as malformed and keeps running, healthy
        assert set(watch.answers) == {"200"}, f"{dict(watch.answers)}; log: {watch.agent.log()[-1500:]}"
