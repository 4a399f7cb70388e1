"""The demo's checks: each holds on what the policy promises and fails, saying what was seen, on
anything else. A check that could not fail would make the demo's exit code meaningless."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from mbridge.demo import flows
from mbridge.demo.flows import FLOWS, POOLS, Context, Expectation, pools_after
from mbridge.demo.timeline import EventTimeline, ImdsApproval, Refusal, SentApproval
from wire.model import Cloud, EventKind

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
CONTEXT = Context(drain_period_seconds=3.0)


def timeline(**fields: object) -> EventTimeline:
    base = EventTimeline("f", Cloud.AZURE, EventKind.REBOOT, "e1", injected_at=T0)
    for name, value in fields.items():
        setattr(base, name, value)
    return base


def stages(**ms: int) -> dict[str, datetime]:
    return {name: T0 + timedelta(milliseconds=value) for name, value in ms.items()}


ACCEPTED = ImdsApproval("web-0", "accepted", T0)

CASES: list[tuple[Expectation, EventTimeline, EventTimeline, str]] = [
    (flows.drained("web-0", "web-1"), timeline(drained=["web-1", "web-0"]), timeline(drained=["web-0"]), "drained"),
    (
        flows.drained_once_each(),
        timeline(drained=["web-0", "web-1"]),
        timeline(drained=["web-0", "web-0"]),
        "more than once",
    ),
    (flows.never_drained(), timeline(), timeline(drained=["web-0"]), "drained ['web-0']"),
    (flows.restored("web-2"), timeline(restored=["web-2"]), timeline(restored=["web-2", "web-2"]), "restored"),
    (flows.never_restored(), timeline(), timeline(restored=["spot-0"]), "restored ['spot-0']"),
    (
        flows.approved_once(),
        timeline(approvals=[ACCEPTED], approve_commands=[SentApproval("web-0", None)]),
        timeline(approvals=[ACCEPTED, ACCEPTED], approve_commands=[SentApproval("web-0", None)]),
        "2 approval POSTs accepted",
    ),
    (
        flows.approved_once(by=("vmss-0",)),
        timeline(approvals=[ImdsApproval("vmss-0", "accepted", T0)], approve_commands=[SentApproval("vmss-0", None)]),
        timeline(approvals=[ACCEPTED], approve_commands=[SentApproval("web-0", None)]),
        "POSTed by ['web-0']",
    ),
    (
        flows.approved_at_once(),
        timeline(approve_commands=[SentApproval("web-2", None)]),
        timeline(approve_commands=[SentApproval("web-2", T0 + timedelta(seconds=3))]),
        "held until",
    ),
    (
        flows.approved_after_drain_period(),
        timeline(stages=stages(drained=200, approved=3300)),
        timeline(stages=stages(drained=200, approved=900)),
        "0.70 s after the drain",
    ),
    (
        flows.never_approved(),
        timeline(approvals=[ImdsApproval("web-2", "unknown-event", T0)]),
        timeline(approvals=[ACCEPTED]),
        "accepted 1",
    ),
    (flows.reached("started"), timeline(stages=stages(started=1)), timeline(), "never started"),
    (flows.ended_as("canceled"), timeline(ended_as="canceled"), timeline(ended_as="completed"), "ended as completed"),
    # an event whose agent is dead ends only as the control plane says
    (
        flows.ended_as("completed"),
        timeline(ended_centrally="completed"),
        timeline(ended_centrally="canceled"),
        "ended as canceled",
    ),
    (flows.found_silent("web-2"), timeline(silent=["web-2"]), timeline(silent=[]), "found silent: []"),
    (flows.silent_after_start(), timeline(), timeline(ended_as="completed"), "ended as completed"),
    (
        flows.restored_after_end(),
        timeline(stages=stages(completed=1000, restored=1020)),
        timeline(stages=stages(completed=1000)),
        "restored at None",
    ),
    (
        # an event of two VMs: the drain period runs from the last one out
        flows.approved_after_drain_period(),
        timeline(
            stages=stages(drained=0, approved=5000),
            vm_stages={"web-0": stages(drained=0), "web-1": stages(drained=2000)},
        ),
        timeline(
            stages=stages(drained=0, approved=4000),
            vm_stages={"web-0": stages(drained=0), "web-1": stages(drained=2000)},
        ),
        "approved 2.00 s after the drain",
    ),
    (
        flows.refused("unverified", "not-self"),
        timeline(refusals=[Refusal("unverified", "u", "web-0", T0), Refusal("not-self", "n", "web-2", T0)],
                 forged=["a", "b"]),
        timeline(refusals=[Refusal("unverified", "u", "web-0", T0)], forged=["a", "b"]),
        "refused ['unverified'] of 2 forged",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("expectation", "holds", "fails", "seen"), CASES, ids=[c[0].text for c in CASES])
def test_each_check_holds_on_the_promise_and_fails_on_anything_else(
    expectation: Expectation, holds: EventTimeline, fails: EventTimeline, seen: str
) -> None:
    assert expectation.check(holds, CONTEXT) is None
    failure = expectation.check(fails, CONTEXT)
    assert failure is not None
    assert seen in failure


def test_the_flows_cover_what_the_demo_promises() -> None:
    assert [flow.key for flow in FLOWS] == [
        "freeze", "user-reboot", "spot-preempt", "scale-in", "gce-migration",
        "platform-reboot", "redeploy-canceled", "gce-terminate", "forged-reboot", "genuine-reboot", "dead-agent",
        "gce-dead-agent",
    ]  # fmt: skip
    assert all(flow.expectations and flow.ends_with for flow in FLOWS)
    assert len({flow.event_id for flow in FLOWS if flow.event_id}) == 9  # no two Azure flows share an event
    # the dead agents' VMs, one a cloud, are in the last phase: nothing after it needs their agents
    dead = [(flow.agent_down, flow.cloud, flow.phase) for flow in FLOWS if flow.agent_down]
    last = max(flow.phase for flow in FLOWS)
    assert dead == [(flows.DEAD_VM, Cloud.AZURE, last), (flows.GCE_VM, Cloud.GCE, last)]
    # the attack is made by a VM of the set, with its own proof, in web-0's name and its own
    forgeries = [forgery for flow in FLOWS for forgery in flow.forgeries]
    assert {forgery.by for forgery in forgeries} == {flows.COMPROMISED}
    assert {forgery.claims for forgery in forgeries} == {"web-0", flows.COMPROMISED}


def test_vms_that_are_gone_stay_out_of_their_pools_and_the_others_come_back() -> None:
    assert pools_after(FLOWS) == {"web": ["web-0", "web-1", "web-2"], "spot": [], "scale-set": [], "gce": ["gce-0"]}
    assert pools_after([]) == {name: sorted(vms) for name, vms in POOLS.items()}
