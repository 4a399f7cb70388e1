"""process(): exactly-once effect whatever the bus redelivers and however many VMs report an event."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from functions.core.keys import claim_key
from functions.core.policy import Policy, Pool
from functions.core.ports import AuditRecord, Finishing
from functions.core.process import CLAIM_LEASE, ClaimBusyError, ClaimWait, Deps, process
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, Killed, RecordingSender
from wire.envelope import encode, envelope_for_event
from wire.errors import PermanentError, RetryableError
from wire.identity import ReporterName
from wire.model import EventKind, EventSource, EventStatus, MaintenanceEvent

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
HOURS_2 = timedelta(hours=2)  # a NotBefore too far for a waiting event to be drained past the budget
SET = ("web-0", "web-1", "web-2")


@dataclass
class World:
    store: SqliteStore
    pool: FakeBalancer
    sent: RecordingSender
    policy: Policy
    clock: FakeClock = field(default_factory=lambda: FakeClock(NOW))  # the invocation's elapsed time

    def deps(self, **overrides: Any) -> Deps:
        fields: dict[str, Any] = {
            "store": self.store,
            "balancer": self.pool,
            "sender": self.sent,
            "audit": self.store,
            "policy": self.policy,
            "monotonic": self.clock.monotonic,
            # The sender is the reporter: trust itself is tested in test_trust.py.
            "verifier": ReporterName(),
        }
        fields.update(overrides)
        return Deps(**fields)

    def run(self, event: MaintenanceEvent, at: datetime = NOW, **overrides: Any) -> Any:
        return process(encode(envelope_for_event(event, at)), self.deps(**overrides), at)

    def run_set(self, event: MaintenanceEvent, at: datetime = NOW, **overrides: Any) -> list[Any]:
        """Every VM the event names reports it, in the order it names them (each VM's own report)."""
        return [self.run(replace(event, reporter=vm), at, **overrides) for vm in event.resources]


@pytest.fixture
def world() -> Iterator[World]:
    store = SqliteStore(":memory:")
    yield World(store, FakeBalancer({"web": SET}), RecordingSender(), Policy())
    store.close()


def reboot(status: EventStatus, reporter: str = "web-0", **fields: Any) -> MaintenanceEvent:
    values: dict[str, Any] = {
        "kind": EventKind.REBOOT,
        "status": status,
        "reporter": reporter,
        "resources": ("web-0",),
        "duration_seconds": -1,
        "not_before": NOW + timedelta(minutes=15),
        "event_id": "E-REBOOT",
    }
    values.update(fields)
    return azure_event(**values)


def test_three_reporters_three_redeliveries_each_affected_vm_drained_approved_restored_once(world: World) -> None:
    # GIVEN a platform Reboot of web-0 and web-1, reported by all three VMs of the set,
    # each report delivered three times, for every step of the lifecycle
    outcomes = []
    for status in (EventStatus.SCHEDULED, EventStatus.STARTED, EventStatus.COMPLETED):
        for reporter in SET:
            for _ in range(3):
                outcomes.append(world.run(reboot(status, reporter=reporter, resources=("web-0", "web-1"))))

    # THEN each VM in Resources was drained once and restored once, on its own report, and the event
    # was approved once, by the report that found both out (an approval starts it for both);
    # web-2's reports of an event of other VMs moved nothing
    assert sorted(world.pool.drained) == ["web-0", "web-1"]
    assert sorted(world.pool.restored) == ["web-0", "web-1"]
    assert [(c.target, c.event_id) for c in world.sent.commands] == [("web-1", "E-REBOOT")]
    assert {c.execute_at for c in world.sent.commands} == {NOW + timedelta(seconds=30)}
    assert world.pool.members("web") == list(SET)
    assert [o.result for o in outcomes].count("not-self") == 9
    assert [o.result for o in outcomes].count("processed") == 6


def test_the_drain_period_counts_from_when_the_vms_are_out_of_their_pools(world: World) -> None:
    # GIVEN a load balancer that takes 10 s to take each VM out
    world.pool.on("remove", lambda _: world.clock.advance(10.0))
    # WHEN a platform Reboot of web-0 arrives at NOW (drain period 30 s)
    world.run(reboot(EventStatus.SCHEDULED))
    # THEN the approval is issued once it is out (NOW + 10 s) and runs 30 s after that
    (approval,) = world.sent.commands
    assert approval.issued_at == NOW + timedelta(seconds=10)
    assert approval.execute_at == NOW + timedelta(seconds=40)
    assert approval.expires_at == approval.issued_at + timedelta(seconds=world.policy.command_ttl_seconds)
    # AND the audit log says when the VM really left its pool, and when the approval went out
    actions = [(line.action, line.vm, line.time) for line in world.store.query() if line.kind == "action"]
    assert actions == [
        ("drain", "web-0", NOW + timedelta(seconds=10)),
        ("approve", "web-0", NOW + timedelta(seconds=10)),
    ]


@pytest.mark.parametrize(
    ("removal_seconds", "execute_after"),
    [
        (10.0, 15.0),  # out at +10 s: the period is cut short by NotBefore - 5 s (+15 s)
        (18.0, None),  # out at +18 s, past NotBefore - 5 s: at once
    ],
)
def test_a_slow_drain_still_approves_no_later_than_not_before_allows(
    world: World, removal_seconds: float, execute_after: float | None
) -> None:
    # GIVEN a Reboot whose NotBefore is 20 s away, and a load balancer slow to take VMs out
    world.pool.on("remove", lambda _: world.clock.advance(removal_seconds))
    # WHEN it is processed
    world.run(reboot(EventStatus.SCHEDULED, not_before=NOW + timedelta(seconds=20)))
    # THEN the approval runs at NotBefore less the 5 s margin, or at once once that is past
    (approval,) = world.sent.commands
    expected = None if execute_after is None else NOW + timedelta(seconds=execute_after)
    assert approval.execute_at == expected


def test_a_crash_between_claim_and_completion_is_completed_exactly_once_by_the_retry(world: World) -> None:
    # GIVEN a first attempt that recorded where web-0 takes traffic, then was killed while removing
    # it (before the change reached the pool)
    event = reboot(EventStatus.SCHEDULED)
    world.pool.fail("remove", Killed())
    with pytest.raises(Killed):
        world.run(event)
    assert world.store.drains("azure:e-reboot")["web-0"]["state"] == "located"

    # WHEN the platform redelivers it after the claim's lease ran out
    later = NOW + CLAIM_LEASE + timedelta(seconds=1)
    world.run(event, at=later)
    world.run(event, at=later)  # and once more: now a duplicate

    # THEN web-0 was drained once, and exactly one approval went out
    assert world.pool.drained == ["web-0"]
    assert len(world.sent.commands) == 1
    assert world.pool.members("web") == ["web-1", "web-2"]


@pytest.mark.parametrize("failure", [Killed(), RetryableError("the answer of the load balancer API was lost")])
def test_a_removal_that_went_through_but_never_answered_is_still_restored(world: World, failure: BaseException) -> None:
    # GIVEN web-0 taken out of the pool, then the invocation died (or lost the API's answer)
    # before it could note that the removal was done
    world.pool.fail("remove", failure, vm="web-0", after=True)
    event = reboot(EventStatus.SCHEDULED)
    with pytest.raises(type(failure)):
        world.run(event)
    assert world.pool.members("web") == ["web-1", "web-2"]

    # WHEN the redelivery finishes the drain and the event later completes
    world.run(event, at=NOW + CLAIM_LEASE + timedelta(seconds=1))
    world.run(reboot(EventStatus.COMPLETED), at=NOW + timedelta(minutes=30))

    # THEN web-0 is back: where it was had been recorded before it was touched
    assert world.pool.members("web") == list(SET)
    assert world.pool.restored == ["web-0"]
    assert len(world.sent.commands) == 1


class _DiesWritingTheRecords:
    """An audit log whose process dies as it is about to write a message's records (and so the claim's
    completion and the drains forgotten that go with them)."""

    def append(self, record: AuditRecord) -> None:
        raise Killed()

    def append_all(self, records: Sequence[AuditRecord], then: Finishing | None = None) -> None:
        raise Killed()

    def query(self, *, vm: str | None = None, event_id: str | None = None) -> Sequence[AuditRecord]:
        return ()


def test_a_completion_that_dies_after_putting_back_keeps_the_drain_for_its_redelivery(world: World) -> None:
    # GIVEN web-0 drained and approved, then a completion that put it back and died before its records,
    # its claim's completion and the forgetting of its drain were written (they go together)
    world.run(reboot(EventStatus.SCHEDULED))
    completed = reboot(EventStatus.COMPLETED)
    with pytest.raises(Killed):
        world.run(completed, at=NOW + timedelta(minutes=30), audit=_DiesWritingTheRecords())
    assert world.pool.members("web") == list(SET)
    assert "web-0" in world.store.drains("azure:e-reboot")

    # WHEN the completion is redelivered once its claim's lease ran out, and once more
    later = NOW + timedelta(minutes=30) + CLAIM_LEASE + timedelta(seconds=1)
    outcomes = [world.run(completed, at=later).result for _ in range(2)]

    # THEN putting it back again changed nothing, its drain is forgotten and the claim done
    assert outcomes == ["processed", "duplicate"]
    assert world.pool.members("web") == list(SET)
    assert world.store.drains("azure:e-reboot") == {}
    # AND the audit log holds the redelivery's restore, the dead attempt having written nothing
    actions = [(line.action, line.vm) for line in world.store.query() if line.kind == "action"]
    assert actions == [("drain", "web-0"), ("approve", "web-0"), ("restore", "web-0")]


def test_a_redelivery_while_the_first_attempt_still_holds_its_lease_is_retried_later(world: World) -> None:
    # GIVEN an invocation that claimed the envelope a moment ago and is still working on it
    event = reboot(EventStatus.SCHEDULED)
    world.store.claim(_claim_key(event), NOW, CLAIM_LEASE)
    # WHEN the bus delivers it again THEN this invocation backs off for a retry
    with pytest.raises(RetryableError, match="another invocation"):
        world.run(event)


def test_the_retry_sends_the_very_same_command_bytes(world: World) -> None:
    # GIVEN an approval sent, then the invocation died before completing its claim
    event = reboot(EventStatus.SCHEDULED, event_source=EventSource.USER)
    world.sent.fail(RetryableError("the invocation died right after sending"), after=True)
    with pytest.raises(RetryableError):
        world.run(event)

    # WHEN the redelivery runs later
    world.run(event, at=NOW + CLAIM_LEASE + timedelta(minutes=1))

    # THEN both sends carried the identical command (same id, same issued_at): the agent answers
    # the second from its ledger and never POSTs twice
    first, second = world.sent.commands
    assert first == second


def test_restore_puts_back_only_what_this_system_drained(world: World) -> None:
    # GIVEN web-1 taken out of the pool by someone else before the event
    world.pool.discard("web", "web-1")
    world.run(reboot(EventStatus.SCHEDULED))

    # WHEN the event completes
    world.run(reboot(EventStatus.COMPLETED))

    # THEN web-0 is back, web-1 stays out: this system never drained it
    assert world.pool.members("web") == ["web-0", "web-2"]


def test_canceled_event_restores_and_never_approves_again(world: World) -> None:
    world.run_set(reboot(EventStatus.SCHEDULED, kind=EventKind.REDEPLOY, resources=("web-0", "web-1")))
    world.run_set(reboot(EventStatus.CANCELED, kind=EventKind.REDEPLOY, resources=("web-0", "web-1")))
    assert len(world.sent.commands) == 1  # the one approval of the scheduled step, once both were out
    assert sorted(world.pool.restored) == ["web-0", "web-1"]


def test_budget_makes_the_second_event_wait_until_the_first_is_over(world: World) -> None:
    # GIVEN a pool of three that may have one VM drained at a time
    world.policy = Policy(pools=(Pool("web", frozenset(SET), max_drained=1),))
    first = reboot(EventStatus.SCHEDULED, event_id="E1", resources=("web-0",))
    second = reboot(
        EventStatus.SCHEDULED,
        event_id="E2",
        resources=("web-1",),
        reporter="web-1",
        not_before=NOW + timedelta(hours=2),
    )

    # WHEN both are scheduled
    world.run(first)
    waiting = world.run(second)

    # THEN the second waits (stored, no drain, no approval) ...
    assert [a.action for a in waiting.actions] == ["wait"]
    assert world.pool.drained == ["web-0"]
    assert [c.event_id for c in world.sent.commands] == ["E1"]

    # ... and the completion of the first admits it: drained, approved after its drain period
    later = NOW + timedelta(minutes=20)
    done = world.run(reboot(EventStatus.COMPLETED, event_id="E1", resources=("web-0",)), at=later)
    assert [a.action for a in done.actions] == ["restore", "drain", "approve"]
    assert world.pool.drained == ["web-0", "web-1"]
    assert [c.event_id for c in world.sent.commands] == ["E1", "E2"]
    assert world.sent.commands[1].execute_at == later + timedelta(seconds=30)


def test_an_event_that_ends_while_waiting_leaves_the_queue(world: World) -> None:
    world.policy = Policy(pools=(Pool("web", frozenset(SET), max_drained=1),))
    world.run(reboot(EventStatus.SCHEDULED, event_id="E1", resources=("web-0",)))
    world.run(reboot(EventStatus.SCHEDULED, event_id="E2", resources=("web-1",)))
    world.run(reboot(EventStatus.CANCELED, event_id="E2", resources=("web-1",)))
    world.run(reboot(EventStatus.COMPLETED, event_id="E1", resources=("web-0",)))
    assert world.pool.drained == ["web-0"]
    assert world.store.parked("web") == []


def test_malformed_envelope_is_audited_and_acknowledged(world: World) -> None:
    outcome = process(b'{"specversion": "1.0"}', world.deps(), NOW)
    assert outcome.result == "malformed"
    (record,) = world.store.query()
    assert record.kind == "malformed"
    assert "id is required" in record.reason


def test_transient_adapter_failure_is_raised_for_retry_and_then_succeeds(world: World) -> None:
    world.pool.fail("remove", RetryableError("the load balancer API timed out"))
    event = reboot(EventStatus.SCHEDULED)
    with pytest.raises(RetryableError):
        world.run(event)
    world.run(event, at=NOW + CLAIM_LEASE + timedelta(seconds=1))
    assert world.pool.drained == ["web-0"]


def test_dry_run_decides_and_audits_but_changes_nothing(world: World) -> None:
    world.policy = Policy(dry_run=True)
    outcome = world.run(reboot(EventStatus.SCHEDULED))
    assert [a.action for a in outcome.actions] == ["drain", "approve"]
    assert world.pool.drained == []
    assert world.sent.commands == []
    reasons = [r.reason for r in world.store.query(vm="web-0") if r.kind == "action"]
    assert reasons == ["dry run: not drained", "dry run: not sent"]


def test_audit_is_queryable_by_vm_and_event(world: World) -> None:
    world.run(reboot(EventStatus.SCHEDULED))
    by_event = world.store.query(event_id="e-reboot")
    assert {r.kind for r in by_event} >= {"event", "decision", "action"}
    assert [r.action for r in world.store.query(vm="web-0") if r.kind == "action"] == ["drain", "approve"]


def _claim_key(event: MaintenanceEvent, at: datetime = NOW) -> str:
    """The claim of the report as `World.run` delivers it at `at` (a redelivery is the same bytes)."""
    envelope = envelope_for_event(event, at)
    return claim_key(envelope.id, event.reporter, envelope.digest)


def test_a_transient_failure_gives_the_claim_back_so_the_next_delivery_proceeds_at_once(world: World) -> None:
    # GIVEN an invocation that failed on a transient load-balancer error
    world.pool.fail("remove", RetryableError("the load balancer API timed out"))
    event = reboot(EventStatus.SCHEDULED)
    with pytest.raises(RetryableError):
        world.run(event)

    # WHEN the platform retries a few seconds later (well within the claim's lease)
    world.run(event, at=NOW + timedelta(seconds=10))

    # THEN the retry was not refused as busy: it drained the VM and sent the approval
    assert world.pool.drained == ["web-0"]
    assert len(world.sent.commands) == 1


# ---------------------------------------------------------------- a restore that fails


def test_a_failed_restore_frees_the_budget_restores_the_rest_and_is_retried_alone(world: World) -> None:
    # GIVEN a pool that may have two VMs out, an event draining web-0 and web-1, and a second
    # event waiting for the budget
    world.policy = Policy(pools=(Pool("web", frozenset(SET), max_drained=2),))
    pair: dict[str, Any] = {"resources": ("web-0", "web-1")}
    world.run_set(reboot(EventStatus.SCHEDULED, **pair))
    e2 = reboot(EventStatus.SCHEDULED, event_id="E2", resources=("web-2",), reporter="web-2", not_before=NOW + HOURS_2)
    waiting = world.run(e2)
    assert [a.action for a in waiting.actions] == ["wait"]

    # WHEN web-0's completion cannot put it back (its pool's API refuses for good)
    world.pool.fail("restore", PermanentError("the role assignment on the NIC is missing"), vm="web-0", times=None)
    later = NOW + timedelta(minutes=20)
    with pytest.raises(PermanentError, match="resubmit"):
        world.run(reboot(EventStatus.COMPLETED, **pair), at=later)
    # (web-1 is still drained: the event keeps its slot)
    assert [c.event_id for c in world.sent.commands] == ["E-REBOOT"]
    # AND web-1's completion puts it back
    world.run(reboot(EventStatus.COMPLETED, reporter="web-1", **pair), at=later)

    # THEN web-1 is back, the budget slot went to the waiting event (drained and approved) although
    # web-0 is still out, and the failure is audited with what to put back by hand
    assert world.pool.restored == ["web-1"]
    assert world.pool.members("web") == ["web-1"]
    assert [c.event_id for c in world.sent.commands] == ["E-REBOOT", "E2"]
    (failed,) = [r for r in world.store.query(vm="web-0") if r.action == "restore_failed"]
    assert "role assignment" in failed.reason
    assert "'pools': ['web']" in failed.reason

    # WHEN the deployment is fixed and the dead-lettered completion is resubmitted
    world.pool.heal("restore", "web-0")
    again = world.run(reboot(EventStatus.COMPLETED, **pair), at=later + timedelta(hours=1))

    # THEN only web-0 is restored, and nothing else is done twice
    assert [(a.action, a.vm) for a in again.actions] == [("restore", "web-0")]
    assert world.pool.restored == ["web-1", "web-0"]
    assert world.pool.members("web") == ["web-0", "web-1"]
    assert len(world.sent.commands) == 2


def test_a_transient_restore_failure_is_retried_and_the_retry_restores_it(world: World) -> None:
    pair: dict[str, Any] = {"resources": ("web-0", "web-1")}
    world.run_set(reboot(EventStatus.SCHEDULED, **pair))
    world.pool.fail("restore", RetryableError("429 from the load balancer API"), vm="web-1", times=None)
    world.run(reboot(EventStatus.COMPLETED, **pair))
    with pytest.raises(RetryableError, match="not be put back yet"):
        world.run(reboot(EventStatus.COMPLETED, reporter="web-1", **pair))
    assert world.pool.restored == ["web-0"]

    world.pool.heal("restore", "web-1")
    # (the claim was given back)
    world.run(reboot(EventStatus.COMPLETED, reporter="web-1", **pair), at=NOW + timedelta(seconds=5))
    assert world.pool.restored == ["web-0", "web-1"]
    assert world.pool.members("web") == list(SET)


# ---------------------------------------------------------------- events spanning pools


def two_pools() -> Policy:
    return Policy(
        pools=(
            Pool("web", frozenset({"web-0", "web-1"}), max_drained=1),
            Pool("api", frozenset({"api-0", "api-1"}), max_drained=1),
        )
    )


@pytest.fixture
def wide(world: World) -> World:
    world.pool.add("api", ("api-0", "api-1"))
    world.policy = two_pools()
    return world


def test_an_event_spanning_two_pools_takes_a_slot_in_each(wide: World) -> None:
    # GIVEN an event over web-0 and api-0 (one slot each pool), each VM reporting its own part
    wide.run_set(reboot(EventStatus.SCHEDULED, event_id="E1", resources=("web-0", "api-0")))

    # WHEN one event per pool follows
    web = wide.run(reboot(EventStatus.SCHEDULED, event_id="E2", resources=("web-1",), reporter="web-1"))
    api = wide.run(reboot(EventStatus.SCHEDULED, event_id="E3", resources=("api-1",), reporter="api-1"))

    # THEN both wait, each on its own pool, and the end of each VM's part admits the one of its pool
    assert [a.action for a in web.actions] == [a.action for a in api.actions] == ["wait"]
    assert [p.event_key for p in wide.store.parked("web")] == ["azure:e2|web-1"]
    assert [p.event_key for p in wide.store.parked("api")] == ["azure:e3|api-1"]
    web_done, api_done = wide.run_set(reboot(EventStatus.COMPLETED, event_id="E1", resources=("web-0", "api-0")))
    assert [(a.action, a.vm) for a in web_done.actions] == [
        ("restore", "web-0"),
        ("drain", "web-1"),
        ("approve", "web-1"),
    ]
    assert [(a.action, a.vm) for a in api_done.actions] == [
        ("restore", "api-0"),
        ("drain", "api-1"),
        ("approve", "api-1"),
    ]
    # E1 once, by api-0's report, which found web-0 out already
    assert [(c.event_id, c.target) for c in wide.sent.commands] == [("E1", "api-0"), ("E2", "web-1"), ("E3", "api-1")]
    assert wide.store.parked("web") == wide.store.parked("api") == []


def test_a_vm_waiting_for_its_pool_holds_no_slot_in_the_other_pool(wide: World) -> None:
    # GIVEN web's only slot taken
    wide.run(reboot(EventStatus.SCHEDULED, event_id="E1", resources=("web-0",)))

    # WHEN an event over api-0 and web-1 is reported by both: web-1 must wait for web, api-0 need not
    api_0, web_1 = wide.run_set(reboot(EventStatus.SCHEDULED, event_id="E2", resources=("api-0", "web-1")))
    assert [a.action for a in api_0.actions] == ["drain", "none"]  # its approval waits for web-1 to be out
    assert [a.action for a in web_1.actions] == ["wait"]

    # THEN the waiting web-1 holds no api slot: an api-only event waits only for E2's api-0
    api = wide.run(reboot(EventStatus.SCHEDULED, event_id="E3", resources=("api-1",), reporter="api-1"))
    assert [a.action for a in api.actions] == ["wait"]
    wide.run(reboot(EventStatus.COMPLETED, event_id="E2", resources=("api-0", "web-1"), reporter="api-0"))
    assert wide.pool.drained == ["web-0", "api-0", "api-1"]


# ---------------------------------------------------------------- a busy claim


def test_a_delivery_waits_out_a_dead_invocations_lease_instead_of_bouncing(world: World) -> None:
    # GIVEN an invocation that claimed the envelope and died (its lease runs for CLAIM_LEASE)
    event = reboot(EventStatus.SCHEDULED)
    clock = FakeClock(NOW + timedelta(minutes=1))
    world.store.claim(_claim_key(event, at=clock.now()), NOW, CLAIM_LEASE)

    # WHEN the bus redelivers it a minute later to an invocation that may wait
    outcome = world.run(event, at=clock.now(), claim_wait=ClaimWait(clock.now, clock.sleep, poll_seconds=5))

    # THEN it waited until the lease ran out, took the claim over and did the work once
    assert outcome.result == "processed"
    assert CLAIM_LEASE - timedelta(minutes=1) <= timedelta(seconds=clock.slept) <= CLAIM_LEASE
    assert world.pool.drained == ["web-0"]
    assert len(world.sent.commands) == 1


def test_a_wait_that_outlasts_its_limit_hands_the_message_back(world: World) -> None:
    event = reboot(EventStatus.SCHEDULED)
    world.store.claim(_claim_key(event), NOW, CLAIM_LEASE)
    clock = FakeClock(NOW)
    wait = ClaimWait(clock.now, clock.sleep, longest=timedelta(seconds=30), poll_seconds=10)
    with pytest.raises(ClaimBusyError):
        world.run(event, claim_wait=wait)
    assert clock.slept == 30
    assert world.pool.drained == []


def test_a_concurrent_delivery_of_the_same_envelope_waits_and_is_a_duplicate(tmp_path: Path) -> None:
    # GIVEN two invocations (threads) sharing one store, the first slow in the load balancer
    store = SqliteStore(tmp_path / "state.db")
    pool = FakeBalancer({"web": SET})
    entered, release = threading.Event(), threading.Event()

    def slow_remove(vm: str) -> None:
        entered.set()
        release.wait(10)

    pool.on("remove", slow_remove, times=1)
    sent = RecordingSender()
    slow = Deps(store, pool, sent, store, Policy(), verifier=ReporterName(), monotonic=FakeClock().monotonic)
    body = encode(envelope_for_event(reboot(EventStatus.SCHEDULED), NOW))

    def now() -> datetime:
        return datetime.now(timezone.utc)

    first = ThreadPoolExecutor(1).submit(process, body, slow, now())
    assert entered.wait(10)

    # WHEN the same envelope arrives meanwhile at an invocation that may wait
    wait = ClaimWait(now, poll_seconds=0.05)
    waiting = Deps(
        store, pool, sent, store, Policy(), claim_wait=wait, verifier=ReporterName(), monotonic=FakeClock().monotonic
    )
    second = ThreadPoolExecutor(1).submit(process, body, waiting, now())
    threading.Timer(0.3, release.set).start()

    # THEN the first does the work and the second, having waited, acknowledges a duplicate
    assert first.result(10).result == "processed"
    assert second.result(10).result == "duplicate"
    assert len(sent.commands) == 1
    assert pool.members("web") == ["web-1", "web-2"]
    store.close()


# ---------------------------------------------------------------- steps that arrive after their event's end


def late_reasons(world: World, event_id: str = "E-REBOOT") -> list[str]:
    return [r.reason for r in world.store.query(event_id=event_id) if r.kind == "action" and r.rule == "late"]


@pytest.mark.parametrize(
    ("step", "end"),
    [
        pytest.param(EventStatus.SCHEDULED, EventStatus.COMPLETED, id="scheduled-after-completed"),
        pytest.param(EventStatus.SCHEDULED, EventStatus.CANCELED, id="scheduled-after-canceled"),
        pytest.param(EventStatus.STARTED, EventStatus.COMPLETED, id="started-after-completed"),
    ],
)
def test_a_step_redelivered_after_its_events_end_drains_nothing_and_sends_no_approval(
    world: World, step: EventStatus, end: EventStatus
) -> None:
    # GIVEN a step of the event that failed once (the load balancer API timed out) ...
    world.pool.fail("remove", RetryableError("the load balancer API timed out"))
    with pytest.raises(RetryableError):
        world.run(reboot(step))
    # ... and the event's end, processed before the bus delivered that step again (no order)
    ended_at = NOW + timedelta(minutes=20)
    world.run(reboot(end), at=ended_at)

    # WHEN the failed step is redelivered
    late = world.run(reboot(step), at=ended_at + timedelta(minutes=1))

    # THEN it is acknowledged without draining or approving anything, and the audit log says why
    assert late.result == "processed"
    assert [(a.action, a.vm) for a in late.actions] == [("none", "web-0")]
    assert world.pool.drained == []
    assert world.sent.commands == []
    assert world.pool.members("web") == list(SET)
    assert late_reasons(world) == [f"late: event already {end.value} at 2026-03-01T12:20:00Z, nothing to do"]


def test_a_late_step_puts_back_what_an_earlier_attempt_drained_after_the_end_was_processed(world: World) -> None:
    # GIVEN a scheduled step that drained web-0 and died before it could check for the event's end,
    # while the completion (processed first, as the bus did not keep order) had nothing to restore
    world.run(reboot(EventStatus.COMPLETED))
    world.store.record_drain("azure:e-reboot", "web-0", {"memento": {"pools": ["web"]}, "state": "removed"})
    world.pool.discard("web", "web-0")

    # WHEN the scheduled step is redelivered
    late = world.run(reboot(EventStatus.SCHEDULED), at=NOW + CLAIM_LEASE + timedelta(seconds=1))

    # THEN web-0 is put back, and nothing else is done
    assert [(a.action, a.vm) for a in late.actions] == [("restore", "web-0")]
    assert world.pool.members("web") == list(SET)
    assert world.store.drains("azure:e-reboot") == {}
    assert world.sent.commands == []


def test_a_step_whose_event_ends_while_it_drains_restores_what_it_drained_and_approves_nothing(world: World) -> None:
    # GIVEN a late scheduled step that passes the check for the event's end, and the completion,
    # processed by another invocation while the first removal is under way
    completed_at = NOW + timedelta(seconds=1)
    completions: list[Any] = []

    def complete_the_event(vm: str) -> None:
        completions.append(world.run(reboot(EventStatus.COMPLETED), at=completed_at))

    world.pool.on("remove", complete_the_event, times=1)

    # WHEN the scheduled step goes on after that removal
    outcome = world.run(reboot(EventStatus.SCHEDULED))

    # THEN its re-check sees the end: the VM it drained is back and no approval went out
    assert [(a.action, a.vm) for a in outcome.actions] == [("drain", "web-0"), ("restore", "web-0")]
    assert world.pool.members("web") == list(SET)
    assert world.sent.commands == []
    assert world.store.drains("azure:e-reboot") == {}
    why = "late: event completed at 2026-03-01T12:00:01Z while this step drained; put back what it drained, no approval"
    assert late_reasons(world) == [why]
    # (and the completion, which ran before web-0 was actually removed, did not leave it out either)
    assert [(a.action, a.vm) for a in completions[0].actions] == [("restore", "web-0")]


@dataclass
class HeldAudit:
    """An audit log that holds what `process` writes at the end of a message (its records, and with
    them its claim's completion and the drains it forgot) until `release`."""

    inner: SqliteStore
    held: list[tuple[list[AuditRecord], Finishing | None]] = field(default_factory=list)

    def append(self, record: AuditRecord) -> None:
        self.inner.append(record)

    def append_all(self, records: Sequence[AuditRecord], then: Finishing | None = None) -> None:
        self.held.append((list(records), then))

    def query(self, *, vm: str | None = None, event_id: str | None = None) -> Sequence[AuditRecord]:
        return self.inner.query(vm=vm, event_id=event_id)

    def release(self) -> None:
        for records, then in self.held:
            self.inner.append_all(records, then)
        self.held.clear()


class CheckingStore(SqliteStore):
    """The local store, running `between` once a drain is recorded removed and before its check of the
    event's end returns: in one atomic write as on Firestore and SQLite (`atomic`), or written first
    and the end read after, as on Table Storage."""

    atomic = True
    between: Any = None

    def record_drain_unless(self, event_key: str, vm: str, memento: Any, ended: str) -> bytes | None:
        if self.atomic:
            found = super().record_drain_unless(event_key, vm, memento, ended)
        else:
            self.record_drain(event_key, vm, memento)
        if self.between is not None:
            between, self.between = self.between, None
            between()
        return found if self.atomic else self.recall(ended)


@pytest.mark.parametrize("atomic", [True, False], ids=["checked-in-the-write", "written-then-read"])
def test_a_completion_that_forgets_a_drain_after_a_step_recorded_it_removed_never_leaves_the_vm_out(
    atomic: bool,
) -> None:
    # GIVEN a scheduled step that recorded web-0 located, and the completion of its event processed
    # right then by another invocation: it marks the end, finds web-0 located and puts it back (it is
    # still in: no change), and its end of message (the drain forgotten) lands only after the step
    # took web-0 out and recorded it removed
    store = CheckingStore(":memory:")
    store.atomic = atomic
    world = World(store, FakeBalancer({"web": SET}), RecordingSender(), Policy())
    completion = HeldAudit(store)
    completions: list[Any] = []

    def complete_the_event(vm: str) -> None:
        completions.append(world.run(reboot(EventStatus.COMPLETED), at=NOW + timedelta(seconds=1), audit=completion))

    world.pool.on("remove", complete_the_event, times=1)
    store.between = completion.release

    # WHEN the scheduled step goes on: it takes web-0 out, records it removed, and checks for the end
    outcome = world.run(reboot(EventStatus.SCHEDULED))

    # THEN it finds the end and puts web-0 back from what it holds (its record is not written, or was
    # forgotten by the completion): nothing is left out, nothing approved, no record left behind
    assert [(a.action, a.vm) for a in completions[0].actions] == [("restore", "web-0")]
    assert [(a.action, a.vm) for a in outcome.actions] == [("drain", "web-0"), ("restore", "web-0")]
    assert world.pool.members("web") == list(SET)
    assert world.sent.commands == []
    assert store.drains("azure:e-reboot") == {}
    store.close()


def test_a_budget_slot_taken_by_a_step_whose_event_ends_while_it_drains_is_freed(world: World) -> None:
    # GIVEN a pool with one slot, and a late scheduled step of E1 whose completion is processed
    # while E1's VM is being removed
    world.policy = Policy(pools=(Pool("web", frozenset(SET), max_drained=1),))
    e1: dict[str, Any] = {"event_id": "E1", "resources": ("web-0",)}
    done: list[Any] = []

    def complete_e1(vm: str) -> None:
        done.append(world.run(reboot(EventStatus.COMPLETED, **e1)))

    world.pool.on("remove", complete_e1, times=1)
    world.run(reboot(EventStatus.SCHEDULED, **e1))

    # WHEN another event of the pool is scheduled
    e2 = world.run(reboot(EventStatus.SCHEDULED, event_id="E2", resources=("web-1",), reporter="web-1"))

    # THEN it goes ahead at once: E1 holds no slot
    assert [a.action for a in e2.actions] == ["drain", "approve"]
    assert [c.event_id for c in world.sent.commands] == ["E2"]


def test_a_waiting_terminate_that_completed_leaves_the_line_and_the_next_one_is_admitted(world: World) -> None:
    # GIVEN a pool with one slot held by E1, and two events waiting: a Terminate (E2) that completed
    # while it waited (the VM is gone; its completion restores nothing), then E3
    world.policy = Policy(pools=(Pool("web", frozenset(SET), max_drained=1),))
    world.run(reboot(EventStatus.SCHEDULED, event_id="E1", resources=("web-0",)))
    terminate: dict[str, Any] = {
        "event_id": "E2",
        "kind": EventKind.TERMINATE,
        "resources": ("web-1",),
        "reporter": "web-1",
    }
    world.run(reboot(EventStatus.SCHEDULED, **terminate))
    world.run(reboot(EventStatus.COMPLETED, **terminate))
    # (its completion took it out of the line at once)
    assert [parked.event_key for parked in world.store.parked("web")] == []
    world.run(reboot(EventStatus.SCHEDULED, event_id="E3", resources=("web-2",), reporter="web-2"))

    # WHEN E1 completes and frees the slot
    done = world.run(reboot(EventStatus.COMPLETED, event_id="E1", resources=("web-0",)), at=NOW + timedelta(hours=1))

    # THEN E2 is never drained and E3 is drained and approved
    assert [(a.action, a.vm) for a in done.actions] == [
        ("restore", "web-0"),
        ("drain", "web-2"),
        ("approve", "web-2"),
    ]
    assert world.pool.drained == ["web-0", "web-2"]
    assert [c.event_id for c in world.sent.commands] == ["E1", "E3"]
    assert world.store.parked("web") == []


def test_an_event_parked_just_after_its_end_is_dropped_once_and_the_next_is_admitted_once(world: World) -> None:
    # GIVEN a pool with one slot held by E1; E2's scheduled step passed the check for an end, E2
    # was canceled (nothing parked to drop yet), and only then was E2 parked; E3 waits behind it
    world.policy = Policy(pools=(Pool("web", frozenset(SET), max_drained=1),))
    world.run(reboot(EventStatus.SCHEDULED, event_id="E1", resources=("web-0",)))
    e2: dict[str, Any] = {"event_id": "E2", "resources": ("web-1",), "reporter": "web-1"}
    world.run(reboot(EventStatus.CANCELED, **e2))
    world.store.park("web", "azure:e2|web-1", encode(envelope_for_event(reboot(EventStatus.SCHEDULED, **e2), NOW)), NOW)
    world.run(reboot(EventStatus.SCHEDULED, event_id="E3", resources=("web-2",), reporter="web-2"))

    # WHEN E1 completes and frees the slot
    done = world.run(reboot(EventStatus.COMPLETED, event_id="E1", resources=("web-0",)), at=NOW + timedelta(hours=1))

    # THEN E2 leaves the line without a drain, and E3 is drained and approved exactly once
    assert [(a.action, a.vm) for a in done.actions] == [
        ("restore", "web-0"),
        ("none", "web-1"),
        ("drain", "web-2"),
        ("approve", "web-2"),
    ]
    assert world.pool.drained == ["web-0", "web-2"]
    assert [c.event_id for c in world.sent.commands] == ["E1", "E3"]
    assert world.store.parked("web") == []


def test_the_lifecycle_in_order_is_unchanged_by_the_check_for_an_end(world: World) -> None:
    # GIVEN a platform Reboot WHEN its steps arrive in order
    steps = [
        world.run(reboot(status), at=NOW + timedelta(minutes=minutes))
        for status, minutes in ((EventStatus.SCHEDULED, 0), (EventStatus.STARTED, 15), (EventStatus.COMPLETED, 25))
    ]

    # THEN each step does what the policy says, and nothing is late
    assert [[a.action for a in step.actions] for step in steps] == [
        ["drain", "approve"],
        ["none"],
        ["restore"],
    ]
    assert [step.decision.rule if step.decision else "" for step in steps] == ["5-platform", "2-started", "1-ended"]
    assert late_reasons(world) == []
    assert world.pool.members("web") == list(SET)
    assert len(world.sent.commands) == 1


def test_a_completed_terminate_frees_its_budget_slot_without_putting_the_vm_back(world: World) -> None:
    # GIVEN a pool with one slot, taken by a scale-in Terminate of web-0, and a Reboot of web-1 waiting
    world.policy = Policy(pools=(Pool("web", frozenset(SET), max_drained=1),))
    terminate: dict[str, Any] = {"event_id": "E1", "kind": EventKind.TERMINATE, "resources": ("web-0",)}
    world.run(reboot(EventStatus.SCHEDULED, **terminate))
    waiting = world.run(reboot(EventStatus.SCHEDULED, event_id="E2", resources=("web-1",), reporter="web-1"))
    assert [a.action for a in waiting.actions] == ["wait"]

    # WHEN the Terminate completes (the VM is deleted)
    done = world.run(reboot(EventStatus.COMPLETED, **terminate), at=NOW + timedelta(minutes=10))

    # THEN web-0 is not put back, its drain record and slot are gone, and the Reboot is admitted
    assert [(a.action, a.vm) for a in done.actions] == [("none", "web-0"), ("drain", "web-1"), ("approve", "web-1")]
    assert world.pool.restored == []
    assert world.pool.drained == ["web-0", "web-1"]
    assert world.store.drains("azure:e1") == {}
    assert world.store.parked("web") == []


@pytest.mark.parametrize("kind", [EventKind.TERMINATE, EventKind.PREEMPT])
def test_a_started_deletion_frees_its_budget_slot_as_no_completion_may_ever_come(world: World, kind: EventKind) -> None:
    # GIVEN a pool with one slot, taken by a Terminate (or Spot eviction) of web-0, and a Reboot of web-1 waiting
    world.policy = Policy(pools=(Pool("web", frozenset(SET), max_drained=1),))
    deletion: dict[str, Any] = {"event_id": "E1", "kind": kind, "resources": ("web-0",)}
    world.run(reboot(EventStatus.SCHEDULED, **deletion))
    world.run(reboot(EventStatus.SCHEDULED, event_id="E2", resources=("web-1",), reporter="web-1"))

    # WHEN the deletion starts: web-0 is going, and its own agent will report nothing more
    started = world.run(reboot(EventStatus.STARTED, **deletion), at=NOW + timedelta(minutes=5))

    # THEN web-0 is not put back, its drain record and slot are gone, and the Reboot is admitted
    assert [(a.action, a.vm) for a in started.actions][-2:] == [("drain", "web-1"), ("approve", "web-1")]
    assert world.pool.restored == []
    assert world.store.drains("azure:e1") == {}
    assert world.store.parked("web") == []

    # AND its completion, if one still came, is late and puts nothing back
    done = world.run(reboot(EventStatus.COMPLETED, **deletion), at=NOW + timedelta(minutes=9))
    assert [a.action for a in done.actions] == ["none"]

    # AND a deletion whose scheduled step comes after its started (buses reorder) is only late: no slot held
    other: dict[str, Any] = {"event_id": "E3", "kind": kind, "resources": ("web-1",), "reporter": "web-1"}
    world.run(reboot(EventStatus.STARTED, **other), at=NOW + timedelta(minutes=10))
    late = world.run(reboot(EventStatus.SCHEDULED, **other), at=NOW + timedelta(minutes=11))
    assert late.decision is not None
    assert late.decision.rule == "late"
    assert world.store.drains("azure:e3") == {}
    assert world.pool.drained == ["web-0", "web-1"]


# ---------------------------------------------------------------- what cannot be carried through is never begun

# Envelopes the decoder takes, whose actions could not all be carried out: the approval command (or
# a drain command, or a store key) cannot hold one of their texts.
UNACTIONABLE: dict[str, dict[str, Any]] = {
    "an event id with a control character": {"event_id": "E-REBOOT\x07"},
    "an event id longer than a command may be": {"event_id": "E" * 70_000},
    "an approval target with a control character": {"reporter": "web-0\x1b", "resources": ("web-0\x1b", "web-1")},
    "a VM name longer than Azure or GCE allow": {"resources": ("web-0", "w" * 81)},
    "more VMs than a scale set holds": {"resources": tuple(f"vm-{n}" for n in range(1001))},
}


@pytest.mark.parametrize("fields", UNACTIONABLE.values(), ids=UNACTIONABLE.keys())
def test_an_event_whose_actions_cannot_all_be_carried_out_drains_nothing_and_is_acknowledged(
    world: World, fields: dict[str, Any]
) -> None:
    # GIVEN a platform Reboot that the envelope decoder accepts, but one of whose texts no
    # approval command could carry
    event = reboot(EventStatus.SCHEDULED, **fields)

    # WHEN it is delivered, and delivered again
    first = world.run(event)
    again = world.run(event, at=NOW + timedelta(seconds=5))

    # THEN nothing was drained or sent: it is audited as malformed and acknowledged, both times
    assert (first.result, again.result) == ("malformed", "malformed")
    assert world.pool.drained == []
    assert world.sent.commands == []
    assert world.pool.members("web") == list(SET)
    assert [record.kind for record in world.store.query()] == ["malformed", "malformed"]


def test_an_envelope_larger_than_a_bus_message_is_acknowledged_as_malformed(world: World) -> None:
    # GIVEN an envelope of more than 256 KiB (a Service Bus message holds no more), its bulk in
    # the description
    event = reboot(EventStatus.SCHEDULED, description="x" * (256 * 1024))

    # WHEN it is delivered
    outcome = world.run(event)

    # THEN it is audited as malformed, and nothing is drained or sent
    assert outcome.result == "malformed"
    assert world.pool.drained == []
    assert world.sent.commands == []


# ---------------------------------------------------------------- audit and log lines of a known size

AUDIT_TEXT = 2048


def test_a_huge_description_is_cut_in_the_audit_log_with_a_marker(world: World) -> None:
    # GIVEN a platform Reboot whose description is 200,000 characters
    event = reboot(EventStatus.SCHEDULED, description="d" * 200_000)

    # WHEN it is processed
    world.run(event)

    # THEN it is acted on, and its audit record keeps the start of the description and says how
    # much was cut, in at most 2 KiB
    (record,) = [record for record in world.store.query() if record.kind == "event"]
    assert len(record.reason) <= AUDIT_TEXT
    assert record.reason.startswith("d" * 1000)
    assert record.reason.endswith(f" …[{200_000 - record.reason.index(' …')} more characters cut]")
    assert world.pool.drained == ["web-0"]


def test_a_malformed_envelope_with_a_huge_value_is_audited_and_logged_in_a_few_kib(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN an envelope whose kind is 100,000 characters long (the decoder quotes what it refuses)
    envelope = json.loads(encode(envelope_for_event(reboot(EventStatus.SCHEDULED), NOW)))
    envelope["data"]["kind"] = "k" * 100_000

    # WHEN it is processed
    outcome = process(json.dumps(envelope).encode(), world.deps(), NOW)

    # THEN the audit record and the log line say why, each in at most 2 KiB and then some
    assert outcome.result == "malformed"
    (record,) = world.store.query()
    assert record.reason.startswith("data.kind must be one of")
    assert len(record.reason) <= AUDIT_TEXT
    (line,) = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert "more characters cut" in line
    assert len(line) <= AUDIT_TEXT + 100


def test_an_event_of_many_vms_names_the_first_twenty_in_its_audit_record(world: World) -> None:
    # GIVEN a Reboot of 1,000 VMs (as many as a scale set holds)
    vms = tuple(f"vmss-web_{n}" for n in range(1000))

    # WHEN one of them reports it
    world.run(reboot(EventStatus.SCHEDULED, reporter=vms[0], resources=vms))

    # THEN the record of the report names the first twenty VMs and counts the others, and the
    # records of what was done name the one VM the report moved (the approval waits for the others)
    event, *rest = world.store.query(event_id="E-REBOOT")
    assert event.kind == "event"
    assert (tuple(event.detail["resources"]), event.detail["resources_not_listed"]) == (vms[:20], 980)
    assert [(record.kind, record.action) for record in rest] == [
        ("decision", ""),
        ("action", "drain"),
        ("action", "none"),
    ]
    assert {tuple(record.detail["resources"]) for record in rest} == {vms[:1]}
    assert rest[-1].reason == (
        "approval held until vmss-web_1, vmss-web_2, vmss-web_3 and 996 more are out of their pools: "
        "Azure starts the event for every VM it names"
    )
