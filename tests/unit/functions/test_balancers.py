"""The SDK-free balancers: the local pool, the agent's /readyz, and several at once.

Each keeps the port's contract: `locate` changes nothing, `remove` and `restore` are idempotent
and touch exactly what the memento names."""

from __future__ import annotations

from datetime import datetime, timezone

from functions.core.balancers import CompositeBalancer, ReadinessBalancer
from functions.local_app.balancer import LocalPool
from tests.kit import RecordingSender
from wire.commands import CommandType

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def pools() -> LocalPool:
    pool = LocalPool(":memory:")
    pool.add("web", ["web-0", "web-1"])
    pool.add("admin", ["web-0"])
    return pool


def test_local_pool_locate_reads_and_remove_takes_out_only_the_memento() -> None:
    pool = pools()
    memento = pool.locate("web-0")
    assert memento == {"pools": ["admin", "web"]}
    assert pool.members("web") == ["web-0", "web-1"]  # nothing changed yet

    pool.remove("web-0", {"pools": ["web"]})
    pool.remove("web-0", {"pools": ["web"]})  # a repeat is harmless

    assert (pool.members("web"), pool.members("admin")) == (["web-1"], ["web-0"])
    assert pool.locate("web-9") is None


def test_local_pool_restore_puts_back_exactly_the_memento_once() -> None:
    pool = pools()
    memento = pool.locate("web-0")
    assert memento is not None
    pool.remove("web-0", memento)
    pool.restore("web-0", memento)
    pool.restore("web-0", memento)
    assert (pool.members("web"), pool.members("admin")) == (["web-0", "web-1"], ["web-0"])


def test_readiness_sends_nothing_to_locate_then_drain_and_restore_commands() -> None:
    sent = RecordingSender()
    balancer = ReadinessBalancer(sent, clock=lambda: NOW)
    memento = balancer.locate("web-0")
    assert memento is not None
    assert memento["readiness"] is True
    assert sent.commands == []
    balancer.remove("web-0", memento)
    balancer.restore("web-0", memento)
    assert [(c.type, c.target) for c in sent.commands] == [
        (CommandType.DRAIN, "web-0"),
        (CommandType.RESTORE, "web-0"),
    ]


def test_composite_keeps_each_balancers_part_and_hands_it_back_to_that_balancer() -> None:
    local, sent = pools(), RecordingSender()
    balancer = CompositeBalancer([("pool", local), ("readiness", ReadinessBalancer(sent, clock=lambda: NOW))])

    memento = balancer.locate("web-1")
    assert memento is not None
    assert memento["pool"] == {"pools": ["web"]}
    assert memento["readiness"]["readiness"] is True
    assert sent.commands == []
    assert local.members("web") == ["web-0", "web-1"]

    balancer.remove("web-1", memento)
    assert local.members("web") == ["web-0"]
    balancer.restore("web-1", memento)
    assert local.members("web") == ["web-0", "web-1"]
    assert [c.type for c in sent.commands] == [CommandType.DRAIN, CommandType.RESTORE]


def test_composite_locates_nothing_when_no_part_holds_the_vm() -> None:
    assert CompositeBalancer([("pool", pools())]).locate("db-0") is None


def test_each_drain_of_a_vm_has_its_own_commands_and_a_retry_reuses_them() -> None:
    # GIVEN one VM drained and restored twice within the same minute (two maintenances)
    sent = RecordingSender()
    balancer = ReadinessBalancer(sent, clock=lambda: NOW)
    first, second = balancer.locate("web-0"), balancer.locate("web-0")
    assert first is not None
    assert second is not None
    for memento in (first, second):
        balancer.remove("web-0", memento)
        balancer.restore("web-0", memento)
    # AND the first drain retried (the invocation failed after sending)
    balancer.remove("web-0", first)

    # THEN the agent gets four distinct commands, so the second maintenance is drained and
    # restored too, and the retry carries the id of the drain it repeats
    ids = [command.command_id for command in sent.commands]
    assert len(set(ids[:4])) == 4
    assert ids[4] == ids[0]
