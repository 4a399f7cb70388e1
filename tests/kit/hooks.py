"""What a fake does around a call, as a test arranges: fail it, slow it, crash in it, or do
something else at that very moment (another invocation, a crash point of a drill)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Hook(Generic[T]):
    method: str
    action: Callable[[T], None]
    who: str | None  # the VM or target it is for, None for all
    times: int | None  # calls left, None for every call
    after: bool  # after the call took effect (its answer lost), instead of before it


class Hooks(Generic[T]):
    """Actions run before or after a fake's calls, in the order they were added."""

    def __init__(self) -> None:
        self._hooks: list[_Hook[T]] = []

    def add(
        self,
        method: str,
        action: Callable[[T], None],
        *,
        who: str | None = None,
        times: int | None = None,
        after: bool = False,
    ) -> None:
        if times is not None and times < 1:
            raise ValueError("a hook runs at least once, or for every call (times=None)")
        self._hooks.append(_Hook(method, action, who, times, after))

    def clear(self, method: str, who: str | None = None) -> None:
        """Drop the hooks of `method` (for `who` only, when given)."""
        self._hooks = [h for h in self._hooks if not (h.method == method and (who is None or h.who == who))]

    def run(self, method: str, who: str, subject: T, *, after: bool) -> None:
        for hook in list(self._hooks):
            if hook.method != method or hook.after != after or hook.who not in (None, who):
                continue
            # Used up before it runs: a call the action makes itself (another invocation reaching
            # the same fake) does not meet it again, and neither does the retry of a call it failed.
            if hook.times is not None:
                hook.times -= 1
                if hook.times == 0:
                    self._hooks.remove(hook)
            hook.action(subject)


def raising(error: BaseException) -> Callable[[object], None]:
    def action(_: object) -> None:
        raise error

    return action
