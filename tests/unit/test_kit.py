"""The testing kit's fakes keep the contracts of the ports they stand for."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.kit import FakeBalancer, FakeClock, RecordingSender
from tests.kit.clock import START
from wire.commands import CommandType, new_command
from wire.errors import RetryableError


def test_the_clock_moves_only_when_told_and_both_readings_together() -> None:
    clock = FakeClock(monotonic=100.0)
    assert (clock.now(), clock.monotonic()) == (START, 100.0)
    clock.advance(30)
    clock.sleep(2.5)
    clock.advance_to(START + timedelta(minutes=1))
    assert (clock.now(), clock.monotonic(), clock.slept) == (START + timedelta(minutes=1), 160.0, 2.5)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)


def test_the_balancer_keeps_the_local_pools_contract_and_counts_effects() -> None:
    balancer = FakeBalancer({"web": ["web-0", "web-1"], "admin": ["web-0"]})
    memento = balancer.locate("web-0")
    assert memento == {"pools": ["admin", "web"]}
    balancer.remove("web-0", memento)
    balancer.remove("web-0", memento)  # a repeat goes through and changes nothing
    assert (balancer.members("web"), balancer.locate("web-0")) == (["web-1"], None)
    balancer.restore("web-0", memento)
    assert balancer.members("admin") == ["web-0"]
    assert balancer.drained == ["web-0", "web-0"]
    assert (balancer.went_out["web-0"], balancer.came_back["web-0"]) == (1, 1)


def test_a_balancer_failure_before_changes_nothing_and_one_after_changes_the_pool() -> None:
    balancer = FakeBalancer({"web": ["web-0", "web-1"]})
    balancer.fail("remove", RetryableError("timed out"), vm="web-0")
    balancer.fail("remove", RetryableError("answer lost"), vm="web-1", after=True)
    for vm in ("web-0", "web-1"):
        with pytest.raises(RetryableError):
            balancer.remove(vm, {"pools": ["web"]})
    assert balancer.members("web") == ["web-0"]
    balancer.remove("web-0", {"pools": ["web"]})  # used up: the retry goes through
    assert balancer.drained == ["web-1", "web-0"]
    assert balancer.calls == [("remove", "web-0"), ("remove", "web-1"), ("remove", "web-0")]


def test_a_lasting_failure_stays_until_healed() -> None:
    sender = RecordingSender()
    command = new_command(CommandType.DRAIN, target="web-0", event_id="E", issued_at=START)
    sender.fail(RetryableError("bus down"), times=None)
    for _ in range(2):
        with pytest.raises(RetryableError):
            sender.send(command)
    sender.heal()
    sender.send(command)
    assert sender.commands == [command]


def test_every_tests_function_deps_take_the_kits_clock_not_the_machines() -> None:
    """`Invocation.moment()` adds the invocation's elapsed time, read on `Deps.monotonic`, to its
    `now`: a test's Deps left on `time.monotonic` computes approval times that depend on how fast
    the machine ran the drain. Every `Deps(...)` a test builds names its `monotonic`."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    unclocked = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Deps":
                names = {keyword.arg for keyword in node.keywords}
                if "monotonic" not in names and None not in names:  # `Deps(**fields)` is checked where fields are
                    unclocked.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert unclocked == [], f"give these Deps the kit's clock (monotonic=FakeClock().monotonic): {unclocked}"
