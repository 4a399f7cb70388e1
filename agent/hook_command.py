"""The hook command as the operator gives it (`--hook-command`): read when the settings are, so a
command that cannot run stops the agent at start. Running it is agent/hooks.py, imported only by
an agent that has a hook."""

from __future__ import annotations

import os
import shlex

__all__ = ["DEFAULT_TIMEOUT", "HookCommandError", "parse_command"]

DEFAULT_TIMEOUT = 30.0


class HookCommandError(ValueError):
    """The hook command cannot be run: empty, badly quoted, or not an executable file."""


def parse_command(text: str) -> list[str]:
    """The hook's argv: `text` split as a shell would (no expansion), its program found on PATH
    or given as a path to an executable file.

    Raises:
        HookCommandError: empty, unbalanced quotes, or a program that is not an executable file.
    """
    try:
        argv = shlex.split(text, posix=os.name != "nt")
    except ValueError as error:
        raise HookCommandError(f"the hook command cannot be split into words ({error})") from None
    if not argv:
        raise HookCommandError("the hook command is empty")
    import shutil  # here: shutil imports the compression modules, which an agent without a hook never needs

    program = shutil.which(argv[0])
    if program is None:
        raise HookCommandError(
            f"{argv[0]!r} is not an executable file (nor one on PATH); give a program or a script with a #! line "
            "and the execute bit"
        )
    return [program, *argv[1:]]
