"""Reports of the control plane beside the agents' (functions/core/central.py): one event whatever
path each step comes by and in whatever order, a silent agent found within the bound, the centre's
end closing what a dead agent left drained, and the centre's duplicates never acting twice.

The agent's reports go through `process` with a proof of the test verifier (tests/identity.py), the
centre's through `process_central`; the store is the local app's SQLite store, the pool its
SQLite pool.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone

import pytest

from functions.core.central import (
    EVENT_GRID,
    GCE_SYSTEM_EVENT,
    RESOURCE_GRAPH,
    WATCH_LINE,
    CentralReport,
    process_central,
    sweep_silent,
)
from functions.core.notify import DEFAULT_TEMPLATE, NoticeFilter, WebhookTemplate, notice_for
from functions.core.policy import Policy, PolicyError, policy_from_mapping
from functions.core.ports import ActionName, AuditKind, JsonObject
from functions.core.process import Outcome, process
from tests.factories import azure_event
from tests.identity import proven
from tests.unit.functions.test_trust import World as AgentsWorld
from tests.unit.functions.test_trust import opened
from wire.commands import CommandType
from wire.envelope import envelope_for_event
from wire.model import Cloud, EventKind, EventSource, EventStatus, MaintenanceEvent
from wire.tracecontext import TraceContext, new_trace

START = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
SET = ("web-0", "web-1", "web-2")
EVENT_ID = "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"
SILENT_AFTER = Policy().silent_agent_seconds


@dataclass
class World(AgentsWorld):
    """The agents' world of tests/unit/functions/test_trust.py, with the control plane beside it."""

    outcomes: list[Outcome] = field(default_factory=list)

    def agent(self, status: EventStatus, vm: str = "web-0", trace: TraceContext | None = None) -> None:
        """web-0's agent reports the step of the Reboot (in `trace`, as an agent of this version does)."""
        event = reboot(status, of=vm)
        carried = trace.attributes() if trace is not None else None
        self.outcomes.append(
            process(proven(envelope_for_event(event, self.clock.now(), carried), vm), self.deps(), self.clock.now())
        )

    def centre(self, status: EventStatus, source: str = EVENT_GRID, vms: tuple[str, ...] = ("web-0",)) -> None:
        """The control plane reports the step of the Reboot."""
        self.outcomes += process_central(central(status, source, vms), self.deps(), self.clock.now())

    def sweep(self) -> list[Outcome]:
        found = sweep_silent(self.deps(), self.clock.now())
        self.outcomes += found
        return found

    def taken(self, action: ActionName) -> list[str]:
        return [taken.vm for outcome in self.outcomes for taken in outcome.actions if taken.action is action]

    def traces(self, vm: str = "web-0") -> list[tuple[str, str, str]]:
        """The sender, status and trace id of each report of the Reboot about `vm`, oldest first."""
        return [
            (str(record.detail.get("sender", "")), record.status, record.trace_id)
            for record in self.store.query(vm=vm, event_id=EVENT_ID)
            if record.kind == AuditKind.EVENT
        ]

    def audited(self, kind: str) -> list[str]:
        return [record.vm for record in self.store.query() if record.kind == kind]

    def approvals(self) -> list[str]:
        return [command.target for command in self.sent.commands if command.type is CommandType.APPROVE]


@pytest.fixture
def world() -> Iterator[World]:
    with opened(World, SET) as made:
        yield made


def reboot(status: EventStatus, of: str = "web-0") -> MaintenanceEvent:
    return azure_event(
        kind=EventKind.REBOOT,
        status=status,
        reporter=of,
        resources=(of,),
        duration_seconds=-1,
        event_source=EventSource.PLATFORM,
        not_before=START + timedelta(minutes=15) if status is EventStatus.SCHEDULED else None,
        event_id=EVENT_ID,
    )


def central(status: EventStatus, source: str = EVENT_GRID, vms: tuple[str, ...] = ("web-0",)) -> CentralReport:
    return CentralReport(
        cloud=Cloud.AZURE,
        event_id=EVENT_ID,
        kind=EventKind.REBOOT,
        status=status,
        vms=vms,
        source=source,
        notice_id=f"{source}-{status.value}",
        not_before=START + timedelta(minutes=15) if status is EventStatus.SCHEDULED else None,
        duration_seconds=-1,
        event_source=EventSource.PLATFORM,
        description="Host server is undergoing maintenance.",
    )


AGENT_S, AGENT_C, CENTRE_S, CENTRE_C = "agent scheduled", "agent completed", "centre scheduled", "centre completed"
STEPS = (AGENT_S, AGENT_C, CENTRE_S, CENTRE_C)


def _interleavings() -> list[tuple[str, ...]]:
    """Every order of the four steps in which each path reports its scheduled before its completed."""
    return [
        order
        for order in itertools.permutations(STEPS)
        if order.index(AGENT_S) < order.index(AGENT_C) and order.index(CENTRE_S) < order.index(CENTRE_C)
    ]


@pytest.mark.parametrize("order", _interleavings(), ids=lambda order: " / ".join(order))
def test_an_event_reported_by_the_agent_and_the_centre_in_any_order_is_one_event(
    world: World, order: tuple[str, ...]
) -> None:
    # GIVEN web-0's Reboot reported by its agent and by the control plane, WHEN the four steps come
    # in this order, a few seconds apart, and the silent-agent sweep runs long after
    steps = {
        AGENT_S: lambda: world.agent(EventStatus.SCHEDULED),
        AGENT_C: lambda: world.agent(EventStatus.COMPLETED),
        CENTRE_S: lambda: world.centre(EventStatus.SCHEDULED),
        CENTRE_C: lambda: world.centre(EventStatus.COMPLETED),
    }
    for step in order:
        steps[step]()
        world.clock.advance(5)
    world.clock.advance(SILENT_AFTER * 10)
    world.sweep()

    # THEN web-0 is back in its pool, drained at most once and put back if it was
    assert sorted(world.pool.members("web")) == list(SET)
    drained = world.taken(ActionName.DRAIN)
    assert drained in ([], ["web-0"])
    assert world.taken(ActionName.RESTORE) == drained
    # ... approved once, by the agent's report, exactly when it came before the event ended
    agent_first = order.index(AGENT_S) < min(order.index(AGENT_C), order.index(CENTRE_C))
    assert world.approvals() == (["web-0"] if agent_first else [])
    assert drained == (["web-0"] if agent_first else [])
    # ... the agent reported: never silent, and nothing is left watched
    assert world.audited(AuditKind.AGENT_SILENT) == []
    assert world.store.parked(WATCH_LINE) == []


def test_a_silent_agent_is_found_once_the_bound_has_passed_and_only_once(world: World) -> None:
    # GIVEN the control plane's report of web-1's Reboot, and no word from web-1's agent
    world.centre(EventStatus.SCHEDULED, vms=("web-1",))

    # WHEN the sweep runs just before the bound, at it, and again later
    world.clock.advance(SILENT_AFTER - 1)
    before = world.sweep()
    world.clock.advance(1)
    at = world.sweep()
    world.clock.advance(SILENT_AFTER)
    later = world.sweep()

    # THEN the silence is audited once, at the bound, and nothing is drained or approved (policy: audit)
    assert (before, len(at), later) == ([], 1, [])
    assert world.audited(AuditKind.AGENT_SILENT) == ["web-1"]
    (record,) = [record for record in world.store.query() if record.kind == AuditKind.AGENT_SILENT]
    assert f"{SILENT_AFTER:.0f} s ago" in record.reason
    assert "mbridge agent --check" in record.reason
    assert sorted(world.pool.members("web")) == list(SET)
    assert world.approvals() == []


def test_with_policy_drain_a_silent_agents_vm_is_drained_never_approved_and_the_centres_end_restores_it(
    world: World,
) -> None:
    # GIVEN policy silent_agents: drain, and web-1's Reboot reported by the control plane only
    world.policy = replace(world.policy, silent_agents="drain")
    world.centre(EventStatus.SCHEDULED, vms=("web-1",))

    # WHEN the bound passes and the sweep runs
    world.clock.advance(SILENT_AFTER)
    world.sweep()

    # THEN web-1 is out of its pool on the centre's word, and no approval went anywhere
    assert "web-1" not in world.pool.members("web")
    assert world.approvals() == []

    # WHEN the control plane reports the event completed (its agent never did)
    world.centre(EventStatus.COMPLETED, vms=("web-1",))

    # THEN web-1 is back
    assert sorted(world.pool.members("web")) == list(SET)
    assert world.taken(ActionName.RESTORE) == ["web-1"]


def test_the_centres_completion_puts_back_a_vm_whose_agent_died_after_its_drain(world: World) -> None:
    # GIVEN web-0 drained and approved on its agent's report, and the agent dead since
    world.agent(EventStatus.SCHEDULED)
    assert "web-0" not in world.pool.members("web")

    # WHEN only the control plane reports the event completed
    world.clock.advance(600)
    world.centre(EventStatus.COMPLETED)

    # THEN web-0 is back in its pool, and the end is the one a late agent report would find
    assert sorted(world.pool.members("web")) == list(SET)
    world.agent(EventStatus.COMPLETED)
    assert world.taken(ActionName.RESTORE) == ["web-0"]


def test_the_centres_duplicates_and_its_second_feed_never_act_twice(world: World) -> None:
    # GIVEN policy silent_agents: drain, and the Reboot of web-1 reported twice by Event Grid (it
    # sends some events twice) and on every pass of the Resource Graph reconciliation
    world.policy = replace(world.policy, silent_agents="drain")
    for source in (EVENT_GRID, EVENT_GRID, RESOURCE_GRAPH, RESOURCE_GRAPH):
        world.centre(EventStatus.SCHEDULED, source, vms=("web-1",))
    world.clock.advance(SILENT_AFTER)
    world.sweep()
    world.sweep()
    for source in (EVENT_GRID, RESOURCE_GRAPH, EVENT_GRID):
        world.centre(EventStatus.COMPLETED, source, vms=("web-1",))

    # THEN it was found silent once, drained once and put back once
    assert world.audited(AuditKind.AGENT_SILENT) == ["web-1"]
    assert world.taken(ActionName.DRAIN) == ["web-1"]
    assert world.taken(ActionName.RESTORE) == ["web-1"]
    assert world.audited(AuditKind.DUPLICATE) == ["web-1"] * 3


def test_a_central_report_of_several_vms_watches_each_and_moves_only_each_own(world: World) -> None:
    # GIVEN one Reboot of web-0 and web-1 (one host), reported by the control plane; web-0's agent reports
    world.centre(EventStatus.SCHEDULED, vms=("web-0", "web-1"))
    world.agent(EventStatus.SCHEDULED, vm="web-0")

    # WHEN the bound passes
    world.clock.advance(SILENT_AFTER)
    world.sweep()

    # THEN only web-1's agent is silent; web-0 was drained and approved on its own report
    assert world.audited(AuditKind.AGENT_SILENT) == ["web-1"]
    assert world.approvals() == ["web-0"]
    assert "web-1" in world.pool.members("web")


def test_the_silent_agent_policy_is_validated() -> None:
    assert policy_from_mapping({"silent_agents": "drain", "silent_agent_seconds": 120}).silent_agents == "drain"
    with pytest.raises(PolicyError, match="'silent_agents' is 'audit'"):
        policy_from_mapping({"silent_agents": "approve"})
    with pytest.raises(PolicyError, match="'silent_agent_seconds' must be >= 0"):
        policy_from_mapping({"silent_agent_seconds": -1})
    with pytest.raises(PolicyError, match="reserved"):
        policy_from_mapping({"pools": {"~central": {"vms": ["web-0"]}}})


def test_an_agent_that_reports_after_it_was_found_silent_is_acted_on_once(world: World) -> None:
    # GIVEN policy silent_agents: drain, and web-0 drained on the centre's word after its agent was silent
    world.policy = replace(world.policy, silent_agents="drain")
    world.centre(EventStatus.SCHEDULED)
    world.clock.advance(SILENT_AFTER)
    world.sweep()

    # WHEN its agent comes back and reports the event, then both paths its end
    world.agent(EventStatus.SCHEDULED)
    world.agent(EventStatus.COMPLETED)
    world.centre(EventStatus.COMPLETED)

    # THEN the VM left its pool once, was approved by its own report only, and is back
    assert world.taken(ActionName.DRAIN) == ["web-0"]
    assert world.approvals() == ["web-0"]
    assert world.taken(ActionName.RESTORE) == ["web-0"]
    assert sorted(world.pool.members("web")) == list(SET)


def test_a_silent_agent_is_announced_by_default(world: World) -> None:
    world.centre(EventStatus.SCHEDULED, vms=("web-1",))
    world.clock.advance(SILENT_AFTER)
    world.sweep()
    (record,) = [record for record in world.store.query() if record.kind == AuditKind.AGENT_SILENT]

    assert NoticeFilter.parse().matches(record)
    notice = notice_for(record, WebhookTemplate.parse(DEFAULT_TEMPLATE), cloud="azure")
    assert "web-1's agent is silent: the control plane reports reboot" in notice.body


def test_the_agents_and_the_centres_ends_at_once_put_the_vm_back_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN web-0 drained on its agent's report
    world.agent(EventStatus.SCHEDULED)
    world.clock.advance(600)

    # WHEN the control plane's completion is processed while the agent's is putting web-0 back
    put_back = world.pool.restore
    centre_first: list[bool] = []

    def restore(vm: str, memento: JsonObject) -> None:
        if not centre_first:
            centre_first.append(True)
            world.centre(EventStatus.COMPLETED)
        put_back(vm, memento)

    monkeypatch.setattr(world.pool, "restore", restore)
    world.agent(EventStatus.COMPLETED)

    # THEN web-0 was put back once, by the end that came first; the other says so
    assert world.taken(ActionName.RESTORE) == ["web-0"]
    assert sorted(world.pool.members("web")) == list(SET)
    reasons = [record.reason for record in world.store.query() if record.kind == AuditKind.DECISION]
    assert any("by another report of it" in reason for reason in reasons)


def test_a_sweep_looks_at_most_at_its_share_of_the_line_the_oldest_first(world: World) -> None:
    # GIVEN three VMs' parts reported by the control plane a second apart, no agent reporting
    for vm in ("web-0", "web-1", "web-2"):
        world.centre(EventStatus.SCHEDULED, vms=(vm,))
        world.clock.advance(1)
    world.clock.advance(SILENT_AFTER)

    # WHEN sweeps may look at two parts each
    first = sweep_silent(world.deps(), world.clock.now(), most=2)
    second = sweep_silent(world.deps(), world.clock.now(), most=2)

    # THEN the first finds the two oldest silent, the next one the last
    assert all(not outcome.actions for outcome in first)  # policy audit: found, not acted on
    assert world.audited(AuditKind.AGENT_SILENT) == ["web-0", "web-1", "web-2"]
    assert (len(first), len(second)) == (2, 1)


def happening(vm: str, at: datetime) -> CentralReport:
    """A report whose id cannot be the agent's (as a GCE system event's): matched by its moment."""
    return replace(central(EventStatus.STARTED, GCE_SYSTEM_EVENT, (vm,)), event_id="centre-own-id", matched_by_time=at)


def test_a_report_matched_by_time_is_the_agents_notice_of_that_kind_near_it(world: World) -> None:
    # GIVEN web-0's agent reported the Reboot starting, and the centre reports a Reboot of web-0 three
    # minutes later under an id of its own
    world.agent(EventStatus.STARTED)
    world.clock.advance(180)
    world.outcomes += process_central(happening("web-0", world.clock.now()), world.deps(), world.clock.now())

    # THEN it is the agent's notice: not watched, never found silent
    assert [entry.event_key for entry in world.store.parked(WATCH_LINE)] == []
    world.clock.advance(SILENT_AFTER)
    assert world.sweep() == []
    repeats = [r.reason for r in world.store.query() if r.kind == AuditKind.DUPLICATE]
    assert repeats == ["web-0's agent already reported this reboot (gce-system-event): the same maintenance"]
    assert [r.kind for r in world.store.query() if r.event_id == "centre-own-id"] == [AuditKind.DUPLICATE]


def test_a_report_matched_by_time_far_from_the_agents_notice_is_found_silent_and_never_drained(
    world: World,
) -> None:
    # GIVEN policy silent_agents: drain, web-0's agent's Reboot an hour ago, and now the centre's
    world.policy = replace(world.policy, silent_agents="drain")
    world.agent(EventStatus.STARTED)
    world.clock.advance(3600)
    world.outcomes += process_central(happening("web-0", world.clock.now()), world.deps(), world.clock.now())

    # WHEN the bound passes
    world.clock.advance(SILENT_AFTER)
    found = world.sweep()

    # THEN the agent is found silent, and the VM is not drained for what was already under way
    assert len(found) == 1
    assert not found[0].actions
    (record,) = [r for r in world.store.query() if r.kind == AuditKind.AGENT_SILENT]
    assert "not drained: the maintenance was already under way" in record.reason
    assert world.taken(ActionName.DRAIN) == ["web-0"]  # the agent's own Reboot, an hour ago, only


# ---------------------------------------------------------------- one trace per event and VM


def test_the_centres_report_joins_the_trace_of_the_agents_report_of_the_event(world: World) -> None:
    # GIVEN web-0's agent reported the Reboot in its own trace, and web-1's agent without one
    agents = new_trace()
    world.agent(EventStatus.SCHEDULED, trace=agents)
    world.agent(EventStatus.SCHEDULED, vm="web-1")
    (web1_trace,) = {trace for _, _, trace in world.traces("web-1")}

    # WHEN the control plane reports the event of both VMs, and its end
    world.clock.advance(60)
    world.centre(EventStatus.SCHEDULED, vms=("web-0", "web-1"))
    world.clock.advance(600)
    world.centre(EventStatus.COMPLETED, vms=("web-0", "web-1"))

    # THEN every record of each VM's part is in that VM's trace: the agent's, or the one the functions
    # started for the agent's report; the centre's outcomes say so too
    assert {record.trace_id for record in world.store.query(vm="web-0", event_id=EVENT_ID)} == {agents.trace_id}
    assert {record.trace_id for record in world.store.query(vm="web-1", event_id=EVENT_ID)} == {web1_trace}
    assert [outcome.trace_id for outcome in world.outcomes[2:]] == [agents.trace_id, web1_trace] * 2
    # ... and nothing sent for the centre's steps carries a trace (its word is not the agent's)
    assert all(command.trace is None for command in world.sent.commands if command.type is not CommandType.APPROVE)


def test_a_centres_report_first_starts_a_trace_its_other_reports_join_and_the_agents_own_wins(
    world: World,
) -> None:
    # GIVEN the control plane reported the Reboot first, by two feeds, and the agent stayed silent
    world.centre(EventStatus.SCHEDULED)
    world.centre(EventStatus.SCHEDULED, source=RESOURCE_GRAPH)
    world.clock.advance(SILENT_AFTER + 1)
    world.sweep()
    centres = world.traces()[0][2]
    assert {record.trace_id for record in world.store.query(vm="web-0", event_id=EVENT_ID)} == {centres}

    # WHEN the agent then reports it in its own trace, and the centre reports the end
    agents = new_trace()
    world.agent(EventStatus.SCHEDULED, trace=agents)
    world.clock.advance(600)
    world.centre(EventStatus.COMPLETED)

    # THEN the agent's report keeps its trace, and the centre's end joins it: the agent's trace wins
    # from its first report on, the centre's records before it stay in the trace the centre started
    assert [(sender.startswith("control plane"), status, trace) for sender, status, trace in world.traces()] == [
        (True, "scheduled", centres),
        (True, "scheduled", centres),
        (False, "scheduled", agents.trace_id),
        (True, "completed", agents.trace_id),
    ]
    assert world.audited(AuditKind.AGENT_SILENT) == ["web-0"]
    (silent,) = [r for r in world.store.query(vm="web-0") if r.kind == AuditKind.AGENT_SILENT]
    assert silent.trace_id == centres
