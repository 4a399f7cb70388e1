"""Load-balancer adapters that need no cloud SDK: draining through the agent's /readyz, and
several balancers at once."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Callable

from functions.core.ports import CommandSender, JsonObject, LoadBalancer
from functions.core.probes import MEMENTO_KEY, ProbeReader, read_seconds
from functions.core.tracing import for_commands
from wire.commands import Command, CommandType, new_command
from wire.errors import PermanentError


class AutohealerConflictError(PermanentError):
    """Draining the VM through /readyz would make its autohealer (a managed instance group's
    autohealing, a scale set's automatic repairs) recreate it: refused, and nothing changed."""


class ReadinessBalancer:
    """Drains a VM by telling its agent to turn /readyz unready (a `drain` command), so a
    health-probe load balancer stops sending it traffic; `restore` turns it ready again.
    No control-plane permission is needed for this path (docs/contracts.md#what-the-agent-checks)."""

    def __init__(
        self,
        sender: CommandSender,
        clock: Callable[[], datetime],
        ttl: timedelta = timedelta(minutes=10),
        signer: Callable[[Command], Command] | None = None,
        guard: Callable[[str], str | None] | None = None,
        probe_seconds: ProbeReader | None = None,
    ) -> None:
        self._sender = sender
        self._clock = clock
        self._ttl = ttl
        self._signer = signer
        # The cloud's autohealer check (functions/gcp_app/autohealer.py): why draining the VM through
        # /readyz would get it recreated, or None. Asked before anything changes.
        self._guard = guard
        # The cloud's reader of how long the balancers that probe the VM's /readyz take to see it
        # unready (functions/core/probes.py); None, or a VM it knows nothing of: the policy's value.
        self._probe_seconds = probe_seconds

    def locate(self, vm: str) -> JsonObject | None:
        if self._guard is not None:
            conflict = self._guard(vm)
            if conflict is not None:
                raise AutohealerConflictError(f"{vm} is not drained: {conflict}")
        # Every VM with an agent has a /readyz to turn. The drain gets an id of its own, kept in the
        # memento: its commands are told apart from those of any other drain of the VM, and a retry
        # of this one reuses them.
        memento: JsonObject = {"readiness": True, "drain": secrets.token_hex(8)}
        # The probe's time is read once, here, and kept with the drain: its retries and the audit
        # count the drain period with the same number.
        seconds = None if self._probe_seconds is None else read_seconds(self._probe_seconds, vm)
        if seconds is not None:
            memento[MEMENTO_KEY] = seconds
        return memento

    def remove(self, vm: str, memento: JsonObject) -> None:
        if memento.get("readiness"):
            self._send(CommandType.DRAIN, vm, memento)

    def restore(self, vm: str, memento: JsonObject) -> None:
        if memento.get("readiness"):
            self._send(CommandType.RESTORE, vm, memento)

    def _send(self, kind: CommandType, vm: str, memento: JsonObject) -> None:
        now = self._clock()
        # One command id per (kind, VM, drain). The agent carries out an id once: a retry that
        # reaches it after the first attempt did is refused as a reuse, and readiness stays
        # as the first attempt set it.
        command_id = hashlib.sha256(f"{kind.value}|{vm}|{memento.get('drain', '')}".encode()).hexdigest()[:32]
        command = new_command(
            kind, target=vm, event_id=f"{kind.value}-{vm}", issued_at=now, expires_at=now + self._ttl,
            command_id=command_id, trace=for_commands(),
        )  # fmt: skip
        self._sender.send(self._signer(command) if self._signer else command)


class CompositeBalancer:
    """Several balancers as one: a VM is drained from each; the memento keeps each one's part."""

    def __init__(self, balancers: Sequence[tuple[str, LoadBalancer]]) -> None:
        self._balancers = list(balancers)

    def locate(self, vm: str) -> JsonObject | None:
        parts = {name: part for name, balancer in self._balancers if (part := balancer.locate(vm)) is not None}
        return parts or None

    def remove(self, vm: str, memento: JsonObject) -> None:
        for name, balancer in self._balancers:
            if name in memento:
                balancer.remove(vm, memento[name])

    def restore(self, vm: str, memento: JsonObject) -> None:
        for name, balancer in self._balancers:
            if name in memento:
                balancer.restore(vm, memento[name])


def readiness_part(memento: JsonObject) -> JsonObject | None:
    """The part of a drain's memento done through the agent's /readyz (ReadinessBalancer's: the memento
    itself, or one part of a CompositeBalancer's), whose load balancers' probes have yet to see it; or
    None."""
    if memento.get("readiness") is True:
        return memento
    return next((part for part in memento.values() if isinstance(part, dict) and part.get("readiness") is True), None)
