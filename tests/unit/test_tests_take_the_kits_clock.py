"""No test may depend on how long something took on the machine.

`Deps.monotonic` measures how long an invocation has run and adds it to its `now`
(functions/core/invocation.py `Invocation.moment`): a test whose `Deps` keeps the default,
`time.monotonic`, computes times that depend on the machine's speed, and failed on a busy machine
(an approval expected at +30 s came out at +30.002 s). Every `Deps(...)` built in the tests names its
`monotonic` (the kit's `FakeClock().monotonic`, or a constant), or passes keywords it was given.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def deps_without_a_clock(source: str) -> list[int]:
    """The lines of `Deps(...)` calls in `source` that leave `monotonic` to its default."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        if name != "Deps":
            continue
        keywords = {keyword.arg for keyword in node.keywords}
        # `**options` may carry it: the caller's call is checked where it is written.
        if "monotonic" not in keywords and None not in keywords:
            lines.append(node.lineno)
    return lines


def test_every_deps_of_the_tests_names_its_monotonic_clock() -> None:
    offenders = {
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in deps_without_a_clock(path.read_text(encoding="utf-8"))
    }
    assert not offenders, f"Deps built on the machine's clock (pass monotonic=FakeClock().monotonic): {offenders}"


def test_the_check_finds_a_deps_on_the_machines_clock() -> None:
    assert deps_without_a_clock("deps = Deps(store=s, balancer=b)\n") == [1]
    assert deps_without_a_clock("deps = invocation.Deps(store=s, monotonic=clock.monotonic)\n") == []
    assert deps_without_a_clock("deps = Deps(**options)\n") == []
