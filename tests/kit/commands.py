"""The one fake of the `CommandSender` port."""

from __future__ import annotations

from collections.abc import Callable

from tests.kit.hooks import Hooks, raising
from wire.commands import Command


class RecordingSender:
    """Records every command it is given, in order; fails or does more where a test says.

    A failure before the send leaves nothing recorded; one `after=True` is a send that went out but
    whose answer was lost (the invocation sees an error, the agent gets the command).
    """

    def __init__(self) -> None:
        self.commands: list[Command] = []
        self._hooks: Hooks[Command] = Hooks()

    def send(self, command: Command) -> None:
        self._hooks.run("send", command.target, command, after=False)
        self.commands.append(command)
        self._hooks.run("send", command.target, command, after=True)

    def on_send(
        self,
        action: Callable[[Command], None],
        *,
        target: str | None = None,
        times: int | None = None,
        after: bool = False,
    ) -> None:
        """Run `action` with each command sent (to `target` only, the next `times` only)."""
        self._hooks.add("send", action, who=target, times=times, after=after)

    def fail(
        self, error: BaseException, *, target: str | None = None, times: int | None = 1, after: bool = False
    ) -> None:
        """Raise `error` from the next `times` sends (None: every send until `heal`)."""
        self._hooks.add("send", raising(error), who=target, times=times, after=after)

    def heal(self, target: str | None = None) -> None:
        self._hooks.clear("send", target)
