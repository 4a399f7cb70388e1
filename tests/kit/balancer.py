"""The one fake of the `LoadBalancer` port."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from functions.core.ports import JsonObject
from tests.kit.hooks import Hooks, raising

METHODS = ("locate", "remove", "restore")


class FakeBalancer:
    """VMs in named pools, in memory, with the contract of the local pool (functions/local_app/balancer.py):
    `locate` names the pools a VM is in (`{"pools": [...]}`, None when in none), `remove` takes it
    out of exactly those, `restore` puts exactly those back; repeating either changes nothing.

    It records what it was asked and what it did, and fails or does more where a test says: a
    failure before a call changes nothing, one `after=True` is a change that went through but whose
    answer was lost.
    """

    def __init__(self, pools: Mapping[str, Iterable[str]] | None = None) -> None:
        self._pools: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        self._hooks: Hooks[str] = Hooks()
        self.calls: list[tuple[str, str]] = []  # (method, vm) of every call, as it came
        self.drained: list[str] = []  # the VM of every removal that went through, in order
        self.restored: list[str] = []  # the VM of every restore that went through, in order
        self.went_out: Counter[str] = Counter()  # effects: a VM in a pool before a removal and in none after
        self.came_back: Counter[str] = Counter()  # a VM in no pool before a restore and in one after
        for pool, vms in (pools or {}).items():
            self.add(pool, vms)

    # ------------------------------------------------------------ the pools, behind the port's back

    def add(self, pool: str, vms: Iterable[str]) -> None:
        with self._lock:
            self._pools.setdefault(pool, set()).update(vms)

    def discard(self, pool: str, vm: str) -> None:
        """Take `vm` out of `pool` as someone else would: nothing is recorded."""
        with self._lock:
            self._pools.get(pool, set()).discard(vm)

    def members(self, pool: str) -> list[str]:
        with self._lock:
            return sorted(self._pools.get(pool, ()))

    def pools_of(self, vm: str) -> list[str]:
        with self._lock:
            return sorted(pool for pool, vms in self._pools.items() if vm in vms)

    # ------------------------------------------------------------ what a test arranges

    def on(
        self,
        method: str,
        action: Callable[[str], None],
        *,
        vm: str | None = None,
        times: int | None = None,
        after: bool = False,
    ) -> None:
        """Run `action` with the VM at each call of `method` (for `vm` only, the next `times` only)."""
        if method not in METHODS:
            raise ValueError(f"a load balancer has no {method!r}: {METHODS}")
        self._hooks.add(method, action, who=vm, times=times, after=after)

    def fail(
        self, method: str, error: BaseException, *, vm: str | None = None, times: int | None = 1, after: bool = False
    ) -> None:
        """Raise `error` from the next `times` calls of `method` (None: every call until `heal`)."""
        self.on(method, raising(error), vm=vm, times=times, after=after)

    def heal(self, method: str, vm: str | None = None) -> None:
        self._hooks.clear(method, vm)

    # ------------------------------------------------------------ the port

    def locate(self, vm: str) -> JsonObject | None:
        self.calls.append(("locate", vm))
        self._hooks.run("locate", vm, vm, after=False)
        pools = self.pools_of(vm)
        self._hooks.run("locate", vm, vm, after=True)
        return {"pools": pools} if pools else None

    def remove(self, vm: str, memento: JsonObject) -> None:
        self.calls.append(("remove", vm))
        self._hooks.run("remove", vm, vm, after=False)
        with self._lock:
            was_in = any(vm in vms for vms in self._pools.values())
            for pool in memento.get("pools", []):
                self._pools.get(pool, set()).discard(vm)
            if was_in and not any(vm in vms for vms in self._pools.values()):
                self.went_out[vm] += 1
            self.drained.append(vm)
        self._hooks.run("remove", vm, vm, after=True)

    def restore(self, vm: str, memento: JsonObject) -> None:
        self.calls.append(("restore", vm))
        self._hooks.run("restore", vm, vm, after=False)
        with self._lock:
            was_out = not any(vm in vms for vms in self._pools.values())
            for pool in memento.get("pools", []):
                self._pools.setdefault(pool, set()).add(vm)
            if was_out and any(vm in vms for vms in self._pools.values()):
                self.came_back[vm] += 1
            self.restored.append(vm)
        self._hooks.run("restore", vm, vm, after=True)
