"""The whole product on one machine: simulator → agents → embedded bus → function core → commands
back → IMDS approval → restore. A platform Reboot of two VMs of an availability set, as deployed:
every agent proves its identity, the functions verify it with the simulator's trust and sign their
commands, and the agents execute only signed commands."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from simulator import Simulator
from tests.agent_runner import AgentThread
from tests.e2e.local_host import Deployment, event_status, running_host
from tests.waiting import wait_until

SET = ["web-0", "web-1", "web-2"]
EVENT_ID = "A1F7E1C3-0D2B-4E8F-9C51-6B2D0F3E8A44"


def test_platform_reboot_is_drained_approved_once_and_restored(
    tmp_path: Path, agent_thread: Callable[..., AgentThread]
) -> None:
    # GIVEN three VMs behind one pool, each with its agent on the embedded bus, and the function
    # host with the default policy but a 1 s drain period
    deployment = Deployment.make(tmp_path, SET)
    pool, store = deployment.pool, deployment.store
    with Simulator(cloud="azure", vm_names=SET, speed=10) as sim:
        for vm, url in zip(sim.vm_names, sim.base_urls):
            agent_thread(deployment.agent(url, vm))
        with running_host(sim, deployment):
            # WHEN Azure schedules a platform Reboot of web-0 and web-1 (broadcast to the whole set), which
            # one approval starts for both
            requests.post(
                f"{sim.base_urls[0]}/_sim/events",
                json={"event_type": "Reboot", "resources": ["web-0", "web-1"], "event_id": EVENT_ID},
                timeout=5,
            ).raise_for_status()

            # THEN both leave the pool, each on its own report, the event is approved once after the
            # drain period of the last one out, and it starts
            wait_until(lambda: pool.members("web") == ["web-2"], 20, lambda: f"drained pool, got {pool.members('web')}")
            wait_until(lambda: len(sim.approvals()) == 1, 20, "the approval POST")
            wait_until(lambda: event_status(sim) == "Started", 20, "the event to start")

            # AND when the maintenance is over, both come back
            requests.post(f"{sim.base_urls[0]}/_sim/events/{EVENT_ID}/advance", timeout=5).raise_for_status()
            wait_until(lambda: pool.members("web") == SET, 20, lambda: f"restored pool, got {pool.members('web')}")
        approvals: list[dict[str, Any]] = sim.approvals()

    (approval,) = approvals
    assert (approval["event_ids"][0], approval["status"]) == (EVENT_ID, 200)
    actions = [(r.action, r.vm) for r in store.query(event_id=EVENT_ID) if r.kind == "action"]
    assert sorted(a for a in actions if a[0] in ("drain", "restore")) == [
        ("drain", "web-0"),
        ("drain", "web-1"),
        ("restore", "web-0"),
        ("restore", "web-1"),
    ]
    # the approval went to the VM whose report found both out, and only once both were
    assert [a for a in actions if a[0] == "approve"] == [("approve", approval["vm"])]
    drains = [r.time for r in store.query(event_id=EVENT_ID) if r.kind == "action" and r.action == "drain"]
    (approved,) = [r.time for r in store.query(event_id=EVENT_ID) if r.kind == "action" and r.action == "approve"]
    assert approved >= max(drains)
    senders = {r.detail.get("sender", "") for r in store.query(event_id=EVENT_ID) if r.kind == "event"}
    assert all(sender.startswith(("reported by web-0, attested", "reported by web-1, attested")) for sender in senders)
