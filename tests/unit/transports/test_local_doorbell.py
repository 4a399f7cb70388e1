"""A waiting command receiver on the embedded bus is woken by the command, not by a timer.

Each test waits far longer than it should take (the receiver's wait is 60 s): a receiver that
polled the file, or missed its doorbell, would hold the test until that wait ran out, and the
join below would report it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from wire.transports.base import InboundCommand, OutboundMessage
from wire.transports.local import LocalBus, LocalTransport

LONG_WAIT = 60.0
JOIN = 10.0


def command(command_id: str, vm: str) -> OutboundMessage:
    return OutboundMessage(envelope_id=command_id, body=b"{}", key=vm)


class Waiting:
    """`receive_commands(LONG_WAIT)` on a thread of its own."""

    def __init__(self, transport: LocalTransport) -> None:
        self.started = threading.Event()
        self.received: Sequence[InboundCommand] | None = None
        self._transport = transport
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self.started.wait(JOIN)

    def _run(self) -> None:
        receiver = self._transport.commands
        assert receiver is not None
        self.started.set()
        self.received = receiver.receive_commands(LONG_WAIT)

    def returned(self) -> bool:
        self._thread.join(JOIN)
        return not self._thread.is_alive()


def test_a_command_sent_from_another_connection_wakes_the_waiting_receiver(tmp_path: Path) -> None:
    agent = LocalTransport.open(tmp_path / "bus.db", "web-0")
    functions = LocalBus(tmp_path / "bus.db")  # the function host's own connection, as another process has
    try:
        # GIVEN web-0's receiver waiting, its doorbell hung
        receiver = agent.commands
        assert receiver is not None
        assert receiver.receive_commands(0.0) == []
        waiting = Waiting(agent)
        # WHEN the functions queue a command for web-0
        assert functions.send_command(command("c1", "web-0"))
        # THEN the wait ends with it, long before the wait's end
        assert waiting.returned(), "the receiver was not woken by the command"
        assert waiting.received is not None
        assert [c.body for c in waiting.received] == [b"{}"]
    finally:
        agent.close()
        functions.close()


def test_a_command_for_another_vm_rings_only_that_vms_doorbell(tmp_path: Path) -> None:
    web0, web1 = LocalTransport.open(tmp_path / "bus.db", "web-0"), LocalTransport.open(tmp_path / "bus.db", "web-1")
    functions = LocalBus(tmp_path / "bus.db")
    try:
        for transport in (web0, web1):
            receiver = transport.commands
            assert receiver is not None
            assert receiver.receive_commands(0.0) == []
        waiting = Waiting(web1)
        functions.send_command(command("c1", "web-0"))
        functions.send_command(command("c2", "web-1"))
        assert waiting.returned()
        # web-1 got only its own; web-0's command waits for web-0
        assert waiting.received is not None
        assert len(waiting.received) == 1
        receiver0 = web0.commands
        assert receiver0 is not None
        assert len(receiver0.receive_commands(0.0)) == 1
    finally:
        web0.close()
        web1.close()
        functions.close()


def test_interrupt_ends_a_wait_with_nothing(tmp_path: Path) -> None:
    agent = LocalTransport.open(tmp_path / "bus.db", "web-0")
    try:
        receiver = agent.commands
        assert receiver is not None
        assert receiver.receive_commands(0.0) == []
        waiting = Waiting(agent)
        receiver.interrupt()
        assert waiting.returned(), "interrupt() did not end the wait"
        assert waiting.received == []
    finally:
        agent.close()


def test_a_closed_receiver_takes_its_doorbell_down(tmp_path: Path) -> None:
    agent = LocalTransport.open(tmp_path / "bus.db", "web-0")
    receiver = agent.commands
    assert receiver is not None
    assert receiver.receive_commands(0.0) == []
    bus = LocalBus(tmp_path / "bus.db")
    assert bus._execute("SELECT COUNT(*) FROM doorbells WHERE target = 'web-0'", ()).fetchone()[0] == 1
    agent.close()
    assert bus._execute("SELECT COUNT(*) FROM doorbells", ()).fetchone()[0] == 0
    # a command for it is still queued, and waits for the next start
    assert bus.send_command(command("c1", "web-0"))
    assert len(bus.open_commands("web-0")) == 1
    bus.close()


def test_a_stray_datagram_costs_a_look_and_nothing_else(tmp_path: Path) -> None:
    agent = LocalTransport.open(tmp_path / "bus.db", "web-0")
    functions = LocalBus(tmp_path / "bus.db")
    try:
        receiver = agent.commands
        assert receiver is not None
        assert receiver.receive_commands(0.0) == []
        waiting = Waiting(agent)
        # GIVEN a ring with no command behind it (anyone on the machine can send one)
        functions._ring("web-0")
        # THEN the receiver keeps waiting, and takes the command that then comes
        functions.send_command(command("c1", "web-0"))
        assert waiting.returned()
        assert waiting.received is not None
        assert len(waiting.received) == 1
    finally:
        agent.close()
        functions.close()


def test_a_resting_agent_takes_its_doorbell_down_and_the_next_wait_hangs_it_again(tmp_path: Path) -> None:
    agent = LocalTransport.open(tmp_path / "bus.db", "web-0")
    receiver = agent.commands
    assert receiver is not None
    bus = LocalBus(tmp_path / "bus.db")
    doorbells = "SELECT COUNT(*) FROM doorbells WHERE target = 'web-0'"
    assert receiver.receive_commands(0.0) == []
    assert bus._execute(doorbells, ()).fetchone()[0] == 1

    agent.rest()  # nothing open on this VM: nobody needs to ring it
    assert bus._execute(doorbells, ()).fetchone()[0] == 0
    assert bus.send_command(command("c1", "web-0"))  # queued while it rests

    received = receiver.receive_commands(0.0)  # the next event opens the path: the command is there
    assert [c.body for c in received] == [command("c1", "web-0").body]
    assert bus._execute(doorbells, ()).fetchone()[0] == 1
    agent.close()
    bus.close()
