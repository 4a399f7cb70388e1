"""Run one of our modules with only the third-party packages that some of our extras bring.

    python tests/e2e/import_guard.py EXTRA[,EXTRA...] MODULE [ARG...]

`make demo` installs `.[demo]` alone; the tests' environment has every extra, so a demo that
started to import a cloud SDK would still pass there and fail on a user's first run. This
refuses, in the process it starts, any import of a top-level package whose distribution is not in
the closure of maintenance-bridge's dependencies plus the named extras: the demo fails at once,
naming the package. Our own packages and the standard library are always importable; a module no
installed distribution claims is let through (nothing to judge it by). Only this process is
guarded, not processes it starts.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import runpy
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = "maintenance-bridge"
OWN = {"agent", "functions", "mbridge", "simulator", "wire", "tests", "bench", "scripts"}


def allowed_distributions(extras: Sequence[str]) -> set[str]:
    """Canonical names of the project, its dependencies with those extras, and theirs, transitively."""
    allowed: set[str] = set()
    pending: list[tuple[str, tuple[str, ...]]] = [(PROJECT, tuple(extras))]
    while pending:
        name, wanted = pending.pop()
        canonical = canonicalize_name(name)
        if canonical in allowed and not wanted:
            continue
        allowed.add(canonical)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # an optional dependency not installed: nothing of it can be imported either
        for line in requires:
            requirement = Requirement(line)
            contexts = [{"extra": extra} for extra in wanted] or [{"extra": ""}]
            if requirement.marker is None or any(requirement.marker.evaluate(c) for c in contexts):
                pending.append((requirement.name, tuple(requirement.extras)))
    return allowed


class ExtrasOnly(importlib.abc.MetaPathFinder):
    """Refuses modules whose file an installed distribution outside the allowed ones holds.

    Judged by file, not by top-level name: namespace packages (`google`) are shared by many
    distributions, some allowed (google-auth) and some not (google-cloud-pubsub)."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        self.owner_of: dict[Path, str] = {}
        for distribution in metadata.distributions():
            owner = canonicalize_name(distribution.metadata["Name"])
            for file in distribution.files or []:
                if file.suffix in (".py", ".so", ".pyd"):
                    self.owner_of[Path(str(distribution.locate_file(file))).resolve()] = owner

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        top = fullname.partition(".")[0]
        if top in OWN or top in sys.stdlib_module_names or top in sys.builtin_module_names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not spec.has_location or spec.origin is None:
            return None  # not found (the import fails as it would), or a namespace package: its modules are judged
        owner = self.owner_of.get(Path(spec.origin).resolve())
        if owner is not None and owner not in self.allowed:
            raise ImportError(
                f"{fullname} comes from {owner}, which the extras given do not bring: add it to the extra in "
                "pyproject.toml, or import it only where that extra is needed"
            )
        return None


def main(argv: Sequence[str]) -> None:
    extras, module, *arguments = argv
    sys.meta_path.insert(0, ExtrasOnly(allowed_distributions([e for e in extras.split(",") if e])))
    sys.argv = [module, *arguments]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
