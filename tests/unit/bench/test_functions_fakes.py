"""The benchmarks' in-memory balancer and sender, and the wrappers that time the real ones."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from bench.functions_fakes import MemoryPool, MemorySender, RecordingBalancer, RecordingSender
from wire.commands import CommandType, new_command

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


def test_a_removed_vm_is_located_nowhere_until_it_is_restored() -> None:
    # GIVEN the pool
    pool = MemoryPool()
    memento = pool.locate("vm-0")
    assert memento is not None

    # WHEN the VM is removed, then put back
    pool.remove("vm-0", memento)
    located_while_out = pool.locate("vm-0")
    pool.restore("vm-0", memento)

    # THEN it was nowhere while out, is back, and each call was counted
    assert located_while_out is None
    assert pool.locate("vm-0") == memento
    assert (pool.removed["vm-0"], pool.restored["vm-0"]) == (1, 1)
    assert pool.out() == set()


def test_the_recording_balancer_notes_when_each_call_returned() -> None:
    # GIVEN a balancer whose clock reads 10, 11, 12 s
    ticks = iter([10.0, 11.0, 12.0])
    inner = MemoryPool()
    balancer = RecordingBalancer(inner, clock=lambda: next(ticks))

    # WHEN two VMs are removed and one put back
    balancer.remove("vm-0", {"pools": ["bench"]})
    balancer.remove("vm-1", {"pools": ["bench"]})
    balancer.restore("vm-0", {"pools": ["bench"]})

    # THEN the real pool changed and the moments are kept per VM, filtered by time
    assert inner.out() == {"vm-1"}
    assert [call.at for call in balancer.removals("vm-0")] == [10.0]
    assert [call.vm for call in balancer.removals(after=10.5)] == ["vm-1"]
    assert [call.at for call in balancer.restorations("vm-0")] == [12.0]


def test_the_recording_sender_passes_commands_on_and_finds_them_by_event() -> None:
    inner = MemorySender()
    sender = RecordingSender(inner, clock=lambda: 5.0)
    approve = new_command(
        CommandType.APPROVE, target="vm-0", event_id="ABC", issued_at=NOW, expires_at=NOW + timedelta(minutes=10)
    )
    drain = new_command(
        CommandType.DRAIN, target="vm-0", event_id="drain-vm-0", issued_at=NOW, expires_at=NOW + timedelta(minutes=10)
    )

    sender.send(drain)
    sender.send(approve)

    assert inner.commands() == [drain, approve]
    assert inner.commands(CommandType.APPROVE) == [approve]
    assert [(sent.command, sent.at) for sent in sender.sent(CommandType.APPROVE, event_id="abc")] == [(approve, 5.0)]
