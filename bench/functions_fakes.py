"""Load balancers and command senders for the function-core benchmarks.

`MemoryPool` and `MemorySender` stand in for the cloud's load balancer and command channel when
only the core and its store are measured (thread-safe, in memory, nothing to wait for).
`RecordingBalancer` and `RecordingSender` wrap the real adapters of a running world and note the
moment each call returned, which is when the drain (or the command) took effect.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from functions.core.ports import CommandSender, JsonObject, LoadBalancer
from wire.commands import Command, CommandType

POOL = "bench"


@dataclass(frozen=True)
class Call:
    vm: str
    at: float  # Unix seconds, when the call returned


class MemoryPool:
    """Every VM takes traffic in one pool until it is removed; counts removals and restorations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._out: set[str] = set()
        self.removed = Counter[str]()
        self.restored = Counter[str]()

    def locate(self, vm: str) -> JsonObject | None:
        with self._lock:
            return None if vm in self._out else {"pools": [POOL]}

    def remove(self, vm: str, memento: JsonObject) -> None:
        with self._lock:
            self._out.add(vm)
            self.removed[vm] += 1

    def restore(self, vm: str, memento: JsonObject) -> None:
        with self._lock:
            self._out.discard(vm)
            self.restored[vm] += 1

    def out(self) -> set[str]:
        with self._lock:
            return set(self._out)


class MemorySender:
    """Keeps every command sent, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._commands: list[Command] = []

    def send(self, command: Command) -> None:
        with self._lock:
            self._commands.append(command)

    def commands(self, kind: CommandType | None = None) -> list[Command]:
        with self._lock:
            return [command for command in self._commands if kind is None or command.type is kind]


class RecordingBalancer:
    """A real balancer, with the moment each remove and restore returned."""

    def __init__(self, inner: LoadBalancer, clock: Callable[[], float] = time.time) -> None:
        self._inner = inner
        self._clock = clock
        self._lock = threading.Lock()
        self._removals: list[Call] = []
        self._restorations: list[Call] = []

    def locate(self, vm: str) -> JsonObject | None:
        return self._inner.locate(vm)

    def remove(self, vm: str, memento: JsonObject) -> None:
        self._inner.remove(vm, memento)
        with self._lock:
            self._removals.append(Call(vm, self._clock()))

    def restore(self, vm: str, memento: JsonObject) -> None:
        self._inner.restore(vm, memento)
        with self._lock:
            self._restorations.append(Call(vm, self._clock()))

    def removals(self, vm: str | None = None, after: float = 0.0) -> list[Call]:
        with self._lock:
            return [call for call in self._removals if (vm is None or call.vm == vm) and call.at >= after]

    def restorations(self, vm: str | None = None, after: float = 0.0) -> list[Call]:
        with self._lock:
            return [call for call in self._restorations if (vm is None or call.vm == vm) and call.at >= after]


@dataclass(frozen=True)
class SentCommand:
    command: Command
    at: float  # Unix seconds, when the channel had taken it


class RecordingSender:
    """A real command sender, with the moment each command was on the channel."""

    def __init__(self, inner: CommandSender, clock: Callable[[], float] = time.time) -> None:
        self._inner = inner
        self._clock = clock
        self._lock = threading.Lock()
        self._sent: list[SentCommand] = []

    def send(self, command: Command) -> None:
        self._inner.send(command)
        with self._lock:
            self._sent.append(SentCommand(command, self._clock()))

    def sent(self, kind: CommandType | None = None, event_id: str | None = None) -> list[SentCommand]:
        with self._lock:
            return [
                entry
                for entry in self._sent
                if (kind is None or entry.command.type is kind)
                and (event_id is None or entry.command.event_id.lower() == event_id.lower())
            ]
