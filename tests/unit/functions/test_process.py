"""process(): exactly-once effect whatever the bus redelivers and however many VMs report an event."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from functions.core.commands import Command
from functions.core.envelope import encode, envelope_for_event
from functions.core.errors import RetryableError
from functions.core.model import EventKind, EventSource, EventStatus, MaintenanceEvent
from functions.core.policy import Policy, Pool
from functions.core.ports import JsonObject
from functions.core.process import CLAIM_LEASE, Deps, process
from functions.local_app.balancer import LocalPool
from functions.local_app.store import SqliteStore
from tests.factories import azure_event

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
SET = ("web-0", "web-1", "web-2")


@dataclass
class CountingPool:
    """The local pool, counting every drain and restore, optionally failing the next drain."""

    pool: LocalPool
    drained: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    fail_next_drain: bool = False

    def drain(self, vm: str) -> JsonObject | None:
        if self.fail_next_drain:
            self.fail_next_drain = False
            raise RetryableError("the load balancer API timed out")
        self.drained.append(vm)
        return self.pool.drain(vm)

    def restore(self, vm: str, memento: JsonObject) -> None:
        self.restored.append(vm)
        self.pool.restore(vm, memento)


@dataclass
class Sent:
    commands: list[Command] = field(default_factory=list)

    def send(self, command: Command) -> None:
        self.commands.append(command)


@dataclass
class World:
    store: SqliteStore
    pool: CountingPool
    sent: Sent
    policy: Policy

    def deps(self, **overrides: Any) -> Deps:
        fields: dict[str, Any] = {
            "store": self.store,
            "balancer": self.pool,
            "sender": self.sent,
            "audit": self.store,
            "policy": self.policy,
        }
        fields.update(overrides)
        return Deps(**fields)

    def run(self, event: MaintenanceEvent, at: datetime = NOW, **overrides: Any) -> Any:
        return process(encode(envelope_for_event(event, at)), self.deps(**overrides), at)


@pytest.fixture
def world() -> Iterator[World]:
    pool = LocalPool(":memory:")
    pool.add("web", SET)
    store = SqliteStore(":memory:")
    yield World(store, CountingPool(pool), Sent(), Policy())
    store.close()


def reboot(status: EventStatus, reporter: str = "web-0", **fields: Any) -> MaintenanceEvent:
    values: dict[str, Any] = {
        "kind": EventKind.REBOOT,
        "status": status,
        "reporter": reporter,
        "resources": ("web-0", "web-1"),
        "duration_seconds": -1,
        "not_before": NOW + timedelta(minutes=15),
        "event_id": "E-REBOOT",
    }
    values.update(fields)
    return azure_event(**values)


def test_three_reporters_three_redeliveries_one_drain_per_vm_one_approval_one_restore(world: World) -> None:
    # GIVEN a platform Reboot of web-0 and web-1, reported by all three VMs of the set,
    # each report delivered three times, for every step of the lifecycle
    for status in (EventStatus.SCHEDULED, EventStatus.STARTED, EventStatus.COMPLETED):
        for reporter in SET:
            for _ in range(3):
                world.run(reboot(status, reporter=reporter))

    # THEN each VM in Resources was drained once and restored once, and one approval went out
    assert sorted(world.pool.drained) == ["web-0", "web-1"]
    assert sorted(world.pool.restored) == ["web-0", "web-1"]
    assert len(world.sent.commands) == 1
    approval = world.sent.commands[0]
    assert (approval.target, approval.event_id) == ("web-0", "E-REBOOT")
    assert approval.execute_at == NOW + timedelta(seconds=30)
    assert world.pool.pool.members("web") == list(SET)


def test_a_crash_between_claim_and_completion_is_completed_exactly_once_by_the_retry(world: World) -> None:
    # GIVEN a first attempt that drained web-0, then failed on web-1 (the invocation died)
    world.pool.fail_next_drain = False
    event = reboot(EventStatus.SCHEDULED)
    original_drain = world.pool.drain
    calls: list[str] = []

    def drain_then_die(vm: str) -> JsonObject | None:
        calls.append(vm)
        if len(calls) == 2:
            raise RetryableError("the invocation died here")
        return original_drain(vm)

    with pytest.raises(RetryableError):
        world.run(event, balancer=_Balancer(drain_then_die, world.pool.restore))

    # WHEN the platform redelivers it after the claim's lease ran out
    later = NOW + CLAIM_LEASE + timedelta(seconds=1)
    world.run(event, at=later)
    world.run(event, at=later)  # and once more: now a duplicate

    # THEN web-0 was not drained again, web-1 was drained, and exactly one approval went out
    assert world.pool.drained == ["web-0", "web-1"]
    assert len(world.sent.commands) == 1


def test_a_redelivery_while_the_first_attempt_still_holds_its_lease_is_retried_later(world: World) -> None:
    # GIVEN an invocation that claimed the envelope a moment ago and is still working on it
    event = reboot(EventStatus.SCHEDULED)
    world.store.claim(_envelope_id(event), NOW, CLAIM_LEASE)
    # WHEN the bus delivers it again THEN this invocation backs off for a retry
    with pytest.raises(RetryableError, match="another invocation"):
        world.run(event)


def test_the_retry_sends_the_very_same_command_bytes(world: World) -> None:
    # GIVEN an approval sent, then the invocation died before completing its claim
    event = reboot(EventStatus.SCHEDULED, event_source=EventSource.USER)
    sender_failures = _FailAfterSend(world.sent)
    with pytest.raises(RetryableError):
        world.run(event, sender=sender_failures)

    # WHEN the redelivery runs later
    world.run(event, at=NOW + CLAIM_LEASE + timedelta(minutes=1))

    # THEN both sends carried the identical command (same id, same issued_at): the agent answers
    # the second from its ledger and never POSTs twice
    first, second = world.sent.commands
    assert first == second


def test_restore_puts_back_only_what_this_system_drained(world: World) -> None:
    # GIVEN web-1 taken out of the pool by someone else before the event
    world.pool.pool.drain("web-1")
    world.run(reboot(EventStatus.SCHEDULED))

    # WHEN the event completes
    world.run(reboot(EventStatus.COMPLETED))

    # THEN web-0 is back, web-1 stays out: this system never drained it
    assert world.pool.pool.members("web") == ["web-0", "web-2"]


def test_canceled_event_restores_and_never_approves_again(world: World) -> None:
    world.run(reboot(EventStatus.SCHEDULED, kind=EventKind.REDEPLOY))
    world.run(reboot(EventStatus.CANCELED, kind=EventKind.REDEPLOY))
    assert len(world.sent.commands) == 1  # the approval of the scheduled step only
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
    world.pool.fail_next_drain = True
    event = reboot(EventStatus.SCHEDULED)
    with pytest.raises(RetryableError):
        world.run(event)
    world.run(event, at=NOW + CLAIM_LEASE + timedelta(seconds=1))
    assert sorted(world.pool.drained) == ["web-0", "web-1"]


def test_dry_run_decides_and_audits_but_changes_nothing(world: World) -> None:
    world.policy = Policy(dry_run=True)
    outcome = world.run(reboot(EventStatus.SCHEDULED))
    assert [a.action for a in outcome.actions] == ["drain", "drain", "approve"]
    assert world.pool.drained == []
    assert world.sent.commands == []
    assert {r.reason for r in world.store.query(vm="web-1") if r.kind == "action"} == {"dry run: not drained"}


def test_audit_is_queryable_by_vm_and_event(world: World) -> None:
    world.run(reboot(EventStatus.SCHEDULED))
    by_event = world.store.query(event_id="e-reboot")
    assert {r.kind for r in by_event} >= {"event", "decision", "action"}
    assert [r.action for r in world.store.query(vm="web-1") if r.kind == "action"] == ["drain"]


@dataclass
class _Balancer:
    drain_fn: Any
    restore_fn: Any

    def drain(self, vm: str) -> JsonObject | None:
        result: JsonObject | None = self.drain_fn(vm)
        return result

    def restore(self, vm: str, memento: JsonObject) -> None:
        self.restore_fn(vm, memento)


@dataclass
class _FailAfterSend:
    inner: Sent

    def send(self, command: Command) -> None:
        self.inner.send(command)
        raise RetryableError("the invocation died right after sending")


def _envelope_id(event: MaintenanceEvent) -> str:
    return envelope_for_event(event, NOW).id


def test_a_transient_failure_gives_the_claim_back_so_the_next_delivery_proceeds_at_once(world: World) -> None:
    # GIVEN an invocation that failed on a transient load-balancer error
    world.pool.fail_next_drain = True
    event = reboot(EventStatus.SCHEDULED)
    with pytest.raises(RetryableError):
        world.run(event)

    # WHEN the platform retries a few seconds later (well within the claim's lease)
    world.run(event, at=NOW + timedelta(seconds=10))

    # THEN the retry was not refused as busy: it drained both VMs and sent the approval
    assert sorted(world.pool.drained) == ["web-0", "web-1"]
    assert len(world.sent.commands) == 1
